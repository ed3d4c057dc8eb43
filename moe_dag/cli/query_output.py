"""Rows of a catalog query written for a person (an aligned table) or a script (CSV, JSON)."""

from __future__ import annotations

import csv
import json
from typing import TextIO

import pyarrow as pa


def write_rows(table: pa.Table, output: str, stream: TextIO) -> None:
    """Every row of `table` to `stream` as `table`, `csv` or `json` (an array of objects)."""
    rows = table.to_pylist()
    if output == "json":
        json.dump(rows, stream, indent=1, default=str)
        stream.write("\n")
    elif output == "csv":
        writer = csv.writer(stream, lineterminator="\n")
        writer.writerow(table.column_names)
        writer.writerows([row[name] for name in table.column_names] for row in rows)
    elif output == "table":
        stream.write(aligned_table(table.column_names, [list(row.values()) for row in rows]))
    else:
        raise ValueError(f"unknown output format {output!r}: table, csv or json")


def aligned_table(header: list[str], rows: list[list[object]], max_cell: int = 80) -> str:
    """Columns padded to their widest cell; numbers right-aligned; long cells cut with an ellipsis."""
    cells = [[_cell(value, max_cell) for value in row] for row in rows]
    widths = [max([len(name), *(len(row[i]) for row in cells)]) for i, name in enumerate(header)]
    numeric = [
        bool(rows) and all(isinstance(row[i], int | float) for row in rows) for i in range(len(header))
    ]

    def line(values: list[str]) -> str:
        padded = (
            v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric, strict=True)
        )
        return "  ".join(padded).rstrip() + "\n"

    rule = "  ".join("-" * w for w in widths) + "\n"
    footer = f"({len(rows)} row{'s' if len(rows) != 1 else ''})\n"
    return line(header) + rule + "".join(line(row) for row in cells) + footer


def _cell(value: object, max_cell: int) -> str:
    text = "NULL" if value is None else " ".join(str(value).split())
    return text if len(text) <= max_cell else text[: max_cell - 1] + "…"
