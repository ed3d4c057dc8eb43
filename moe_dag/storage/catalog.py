"""The DuckDB catalog: one database file with views over the lake's parquet.

Every table in the lake carries its own `source` column, so views read without hive partitioning.
Views read the parquet at query time, so a partition written after the view was made shows up without
touching the database. DuckDB allows one writer at a time: only global steps call `refresh`, never
per-source partition runs (which may run in parallel).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from glob import escape as escape_glob
from pathlib import Path

import duckdb
import pyarrow as pa
from fsspec.implementations.dirfs import DirFileSystem

from moe_dag.storage.lake import Lake
from moe_dag.storage.schema import DUPLICATE_REASONS, LANGUAGE_NOT_ACCEPTED

# Each mixture's packed rows -> (document, token span), written beside its train.npy by the packing
# (moe_dag/mixture/build.py, SEQUENCES_FILE): the views `tokenized_mixture_sequences` and
# `unfiltered_mixture_sequences`.
MIXTURE_SEQUENCE_STAGES = ("tokenized_mixture/sequences", "unfiltered_mixture/sequences")
# Stage name -> whether it is written per source. Order is the order documents flow through.
LAKE_STAGES = {
    "raw_documents": True,
    "quarantine": True,
    "prefiltered": True,
    "minhash_signatures": True,
    "dedup_clusters": False,
    "deduplicated": True,
    "toxicity_filtered": True,
    "oracle_sample": False,
    "calibration_sample": False,
    "oracle_labels": False,
    "oracle_label_failures": False,
    "oracle_label_cache": False,
    "scored_documents": True,
    "proxy_eval": False,
    "evaluation_documents": False,  # the neutral and user evaluation sets' documents
    "proxy_eval_sets": False,  # the proxy on those sets
    "mixture_search": False,  # the mixture search's candidates, proposal and configured mixture
    **dict.fromkeys(MIXTURE_SEQUENCE_STAGES, False),
}
DECISION_STAGES = ["prefiltered", "deduplicated", "toxicity_filtered", "scored_documents"]
FUNNEL_STAGES = ["raw_documents", *DECISION_STAGES]

FUNNEL_SQL = """
CREATE OR REPLACE TABLE stage_funnel AS
SELECT 'raw_documents' AS stage, source, count(*) AS rows_in, count(*) AS kept, 0 AS dropped
FROM raw_documents GROUP BY source
{unions}
ORDER BY source, stage
"""


# Per source and language (as language ID placed it at the prefilter; 'und' where it did not run or could
# not place the text): documents that came in, and documents kept at the end of curation. As in the
# languages_kept check, text in a language the source does not accept, and duplicates (their text lives on
# in their cluster's survivor), are not counted: neither is a loss of that language.
LANGUAGE_FUNNEL_SQL = f"""
CREATE OR REPLACE TABLE language_funnel AS
SELECT p.source, coalesce(p.language, 'und') AS language, count(*) AS documents,
       count(s.id) FILTER (WHERE s.keep) AS kept, round(kept / documents, 4) AS kept_share
FROM prefiltered p
LEFT JOIN deduplicated d ON d.source = p.source AND d.id = p.id
LEFT JOIN scored_documents s ON s.source = p.source AND s.id = p.id
WHERE p.reason IS DISTINCT FROM '{LANGUAGE_NOT_ACCEPTED}'
  AND coalesce(d.reason, '') NOT IN ({", ".join(f"'{reason}'" for reason in DUPLICATE_REASONS)})
GROUP BY ALL ORDER BY p.source, language
"""


def view_name(stage: str) -> str:
    """The catalog's view of a lake stage: its name, with a folder's `/` as `_` (`tokenized_mixture/
    sequences` is the view `tokenized_mixture_sequences`)."""
    return stage.replace("/", "_")


STAGE_OF_VIEW = {view_name(stage): stage for stage in LAKE_STAGES}


def funnel_sql() -> str:
    unions = "\n".join(
        f"UNION ALL SELECT '{stage}', source, count(*), count(*) FILTER (WHERE keep), "
        f"count(*) FILTER (WHERE NOT keep) FROM {stage} GROUP BY source"
        for stage in DECISION_STAGES
    )
    return FUNNEL_SQL.format(unions=unions)


class Catalog:
    def __init__(self, path: str | Path, lake: Lake) -> None:
        self.path = Path(path)
        self.lake = lake

    def connect(self, read_only: bool = False) -> duckdb.DuckDBPyConnection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        con = duckdb.connect(str(self.path), read_only=read_only)
        if not self.lake.is_local:
            # DuckDB reads an object-store lake through the lake's own fsspec filesystem (its storage
            # settings included), not through its httpfs extension, which it would have to download.
            con.register_filesystem(self.lake.fs)
        return con

    def refresh(self, stages: dict[str, bool] = LAKE_STAGES) -> list[str]:
        """Create or replace one view per stage that has data; `stages` maps name -> partitioned."""
        created = []
        with self.connect() as con:
            for stage, partitioned in stages.items():
                pattern = self.lake.glob_pattern(stage, partitioned)
                if not self.lake.fs.glob(pattern.split("://", 1)[-1]):
                    continue
                con.execute(f"CREATE OR REPLACE VIEW {view_name(stage)} AS {_stage_select(pattern)}")
                created.append(view_name(stage))
        return created

    def write_stage_funnel(self) -> list[tuple]:
        """(Re)build `stage_funnel` from the stage views; returns its rows."""
        with self.connect() as con:
            con.execute(funnel_sql())
            return con.execute("SELECT stage, source, rows_in, kept, dropped FROM stage_funnel").fetchall()

    def write_language_funnel(self) -> list[tuple]:
        """(Re)build `language_funnel` (see LANGUAGE_FUNNEL_SQL); returns its rows. Empty until language ID
        and scoring have run (a lake of code sources has no `language` column)."""
        with self.connect() as con:
            views = {row[0] for row in con.execute("SELECT view_name FROM duckdb_views()").fetchall()}
            columns = set()
            if "prefiltered" in views:
                columns = {row[0] for row in con.execute("DESCRIBE prefiltered").fetchall()}
            if "scored_documents" not in views or "language" not in columns:
                con.execute(
                    "CREATE OR REPLACE TABLE language_funnel (source VARCHAR, language VARCHAR, "
                    "documents BIGINT, kept BIGINT, kept_share DOUBLE)"
                )
            else:
                con.execute(LANGUAGE_FUNNEL_SQL)
            return con.execute("SELECT * FROM language_funnel").fetchall()

    def query(self, sql: str) -> list[tuple]:
        """Rows of a read-only query (see `reader`)."""
        _check_read_only(sql)
        with self.reader() as con, _one_line_errors():
            return con.execute(sql).fetchall()

    def query_arrow(self, sql: str) -> pa.Table:
        _check_read_only(sql)
        with self.reader() as con, _one_line_errors():
            return con.sql(sql).to_arrow_table()

    def reader(self) -> duckdb.DuckDBPyConnection:
        """A connection that can read the catalog and the lake and write nothing anywhere.

        The database is opened read-only. The lake is reached only through a read-only filesystem
        (`LAKE_PROTOCOL`), over which temporary views shadow the stored ones; the local filesystem is
        switched off (the database file stays open), so no path, the lake's included, can be written,
        attached or exported to; nothing spills to disk; extensions cannot be installed or loaded; and
        the configuration is locked so a query cannot undo any of it.
        """
        if not self.path.exists():
            raise CatalogError(f"the catalog {self.path} does not exist yet: materialise document_catalog")
        try:
            con = duckdb.connect(
                str(self.path),
                read_only=True,
                config={"autoinstall_known_extensions": False, "autoload_known_extensions": False},
            )
        except duckdb.IOException as error:
            if "lock" in str(error).lower():
                raise CatalogError(
                    f"the catalog {self.path} is locked by a running materialisation; "
                    "query again when it finishes"
                ) from error
            raise CatalogError(f"cannot open the catalog {self.path}: {error}") from error
        con.register_filesystem(ReadOnlyLakeFileSystem(path=self.lake.root, fs=self.lake.fs))
        for name, sql in con.execute(
            "SELECT view_name, sql FROM duckdb_views() WHERE NOT internal"
        ).fetchall():
            # A stage view reads this lake whatever lake root it was stored with (matched by the
            # stage's place below the root): a catalog copied or moved with its lake reads the lake it
            # is opened with.
            stage = STAGE_OF_VIEW.get(name, name)
            for partitioned in (True, False):
                below_root = f"/{stage}/{'source=*/' if partitioned else ''}*.parquet'"
                if below_root in sql:
                    pattern = f"{LAKE_PROTOCOL}://{stage}/{'source=*/' if partitioned else ''}*.parquet"
                    con.execute(f"CREATE TEMP VIEW {name} AS {_stage_select(pattern)}")
                    break
        # DuckDB reads a registered Python filesystem's file objects from several threads at once, and
        # fsspec's file objects are not safe for that: interleaved seeks and reads come back short ("Out
        # of buffer" on a join of two stages). One thread reads the lake correctly.
        con.execute("SET threads = 1")
        # DuckDB's parquet prefetching reads column chunks of a Python filesystem's files at offsets past
        # the file's end ("Failed to read 282916 bytes ... only 25805 bytes returned", "Payload value
        # bigger than allowed"): the demo summary's injected-noise line failed so on every try on a
        # fresh demo lake, with threads at 1. Without prefetching it reads every time.
        con.execute("SET disable_parquet_prefetching = true")
        con.execute("SET temp_directory = ''")
        con.execute("SET allowed_directories = ?", [[f"{LAKE_PROTOCOL}://"]])
        con.execute("SET enable_external_access = false")
        con.execute("SET disabled_filesystems = 'LocalFileSystem'")
        con.execute("SET lock_configuration = true")
        return con


LAKE_PROTOCOL = "moedaglake"


class ReadOnlyLakeFileSystem(DirFileSystem):
    """The lake as `moedaglake://<path under the root>`, for reading only: no write, no `..`."""

    protocol = LAKE_PROTOCOL

    def _join(self, path):  # type: ignore[no-untyped-def] - fsspec passes a str or a list of str
        for one in [path] if isinstance(path, str) else path:
            if ".." in self._strip_protocol(one).split("/"):
                raise PermissionError(f"{one}: the catalog reads only inside the lake")
        return super()._join(path)

    def glob(self, path, **kwargs):  # type: ignore[no-untyped-def] - fsspec's signature
        # The root is a folder, not a pattern: a lake under `runs[1]/` would match nothing.
        self._join(path)  # refuses `..`
        found = self.fs.glob(self.fs.sep.join((escape_glob(self.path), self._strip_protocol(path))), **kwargs)
        return self._relpath_detail(found) if kwargs.get("detail") else self._relpath(found)

    def open(self, path, mode="rb", *args, **kwargs):  # type: ignore[no-untyped-def] - fsspec's signature
        if mode not in ("r", "rb"):
            raise PermissionError(f"{path}: the catalog reads the lake and writes nothing")
        return super().open(path, mode, *args, **kwargs)

    def _refuse(self, path, *args, **kwargs):  # type: ignore[no-untyped-def]
        raise PermissionError(f"{path}: the catalog reads the lake and writes nothing")

    rm = rm_file = mkdir = makedirs = mv = copy = touch = pipe_file = _refuse


def _stage_select(pattern: str) -> str:
    return (
        f"SELECT * FROM read_parquet({sql_literal(pattern)}, hive_partitioning = false, union_by_name = true)"
    )


class CatalogError(RuntimeError):
    """A catalog query that cannot run, with a one-line reason for the person who asked."""


def _check_read_only(sql: str) -> None:
    """Refuse anything but one SELECT, bare or under EXPLAIN [ANALYZE], by DuckDB's own parse.

    EXPLAIN ANALYZE runs the statement it explains, so the statement inside counts, not the EXPLAIN.
    """
    with _one_line_errors():
        statements = duckdb.extract_statements(sql)
        if len(statements) != 1:
            raise CatalogError(f"give exactly one SQL statement, got {len(statements)}")
        statement, inside = statements[0], ""
        while statement.type == duckdb.StatementType.EXPLAIN:
            statement, inside = _explained_statement(statement.query), " (inside EXPLAIN)"
    if statement.type != duckdb.StatementType.SELECT:
        raise CatalogError(f"only queries can run on the catalog, not {statement.type.name}{inside}")


def _explained_statement(explain: str) -> duckdb.Statement:
    """The statement an EXPLAIN [ANALYZE] [(options)] names, found with DuckDB's tokenizer."""
    starts = [start for start, _ in duckdb.tokenize(explain)]
    ends = [*starts[1:], len(explain)]
    words = [explain[start:end].strip().upper() for start, end in zip(starts, ends, strict=True)]
    position = 2 if words[1:2] in (["ANALYZE"], ["ANALYSE"]) else 1
    if words[position : position + 1] == ["("]:
        depth = 0
        for offset, word in enumerate(words[position:]):
            depth += word.count("(") - word.count(")")
            if depth == 0:
                position += offset + 1
                break
    if position >= len(words):
        raise CatalogError("EXPLAIN of nothing")
    inner = duckdb.extract_statements(explain[starts[position] :])
    if len(inner) != 1:
        raise CatalogError(f"give exactly one SQL statement, got {len(inner)}")
    return inner[0]


@contextlib.contextmanager
def _one_line_errors() -> Iterator[None]:
    try:
        yield
    except duckdb.Error as error:
        raise CatalogError(_one_line(error)) from error


def _one_line(error: Exception) -> str:
    """The error on one line; of a Python traceback DuckDB passes on (from the lake's filesystem),
    only its last line, which says what was refused."""
    text = str(error)
    if "Traceback (most recent call last)" in text:
        text = text.strip().splitlines()[-1]
    return " ".join(text.split())


def sql_literal(value: str) -> str:
    """`value` as a SQL string literal: DuckDB views cannot take bound parameters, so quote it."""
    return "'" + value.replace("'", "''") + "'"


def chain_breaks(funnel: list[tuple]) -> list[str]:
    """Each stage must receive exactly the rows the stage before it kept, source by source."""
    order = FUNNEL_STAGES
    by_key = {(stage, source): (rows_in, kept) for stage, source, rows_in, kept, _ in funnel}
    breaks = []
    for source in sorted({source for _, source, *_ in funnel}):
        for before, after in zip(order, order[1:], strict=False):
            kept_before = by_key.get((before, source), (0, 0))[1]
            rows_after = by_key.get((after, source), (0, 0))[0]
            if kept_before != rows_after:
                breaks.append(f"{source}: {before} kept {kept_before} but {after} received {rows_after}")
    return breaks
