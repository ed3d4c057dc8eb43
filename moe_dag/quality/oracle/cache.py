"""The label cache: every label ever paid for, kept in the lake under the key that produced it.

A label is reusable exactly when the same text is scored on the same rubric, with the same prompt, by
the same model, so the key is (text hash, rubric, prompt version, model). The cache is a parquet
dataset under `<lake>/oracle_label_cache/`, one file per committed batch, written under a hidden
temporary name (not `*.parquet`) and renamed: a run killed halfway has lost at most the batch it had
not committed, and its half file is seen by no reader and removed by the next labelling run. DuckDB
reads the cache as the `oracle_label_cache` view.

Files accumulate one per batch; `compact` merges them into one when there are many (a kill between
writing the merged file and removing the old ones leaves duplicates, which lookups ignore).
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import time
import uuid
from collections.abc import Iterable, Sequence

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from moe_dag.quality.oracle.base import DIMENSIONS, OracleLabel
from moe_dag.storage.atomic import atomic_write
from moe_dag.storage.lake import Lake

CACHE_STAGE = "oracle_label_cache"
CacheKey = tuple[str, str]  # (text hash, rubric); model and prompt version are fixed per lookup

CACHE_SCHEMA = pa.schema(
    [
        pa.field("text_hash", pa.string(), nullable=False),
        pa.field("rubric", pa.string(), nullable=False),
        pa.field("prompt_version", pa.string(), nullable=False),
        pa.field("model", pa.string(), nullable=False),
        pa.field("scores", pa.string(), nullable=False),
        pa.field("quality", pa.float64(), nullable=False),
        # The document that paid for the label, for tracing it back; other documents with the same
        # text reuse it.
        pa.field("id", pa.string(), nullable=False),
        pa.field("source", pa.string(), nullable=False),
        pa.field("labelled_at", pa.timestamp("ms", tz="UTC"), nullable=False),
    ]
    + [pa.field(f"score_{dim}", pa.int8()) for dim in DIMENSIONS]
)


def text_hash(text: str) -> str:
    """128-bit BLAKE2b of the UTF-8 text, hex: the text part of the cache key."""
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).hexdigest()


class LabelCache:
    def __init__(self, lake: Lake, stage: str = CACHE_STAGE) -> None:
        self.lake, self.stage = lake, stage
        self.folder = lake.dataset_dir(stage)

    def parts(self) -> list[str]:
        return sorted(self.lake.files_matching(self.folder, "part-*.parquet"))

    def lookup(self, keys: Iterable[CacheKey], model: str, prompt_version: str) -> dict[CacheKey, str]:
        """The cached scores (JSON) for those of `keys` labelled by `model` with `prompt_version`."""
        wanted = set(keys)
        parts = self.parts()
        if not wanted or not parts:
            return {}
        dataset = ds.dataset(parts, filesystem=self.lake.fs, format="parquet")
        selected = (pc.field("model") == model) & (pc.field("prompt_version") == prompt_version)
        table = dataset.to_table(columns=["text_hash", "rubric", "scores"], filter=selected)
        found: dict[CacheKey, str] = {}
        for digest, rubric, scores in zip(*(table[c].to_pylist() for c in table.column_names), strict=True):
            if (digest, rubric) in wanted:
                found.setdefault((digest, rubric), scores)
        return found

    def commit(self, labels: Sequence[tuple[str, OracleLabel]]) -> str | None:
        """Write (text hash, label) pairs as one new batch file; returns its path."""
        if not labels:
            return None
        now = pa.scalar(time.time_ns() // 1_000_000, pa.timestamp("ms", tz="UTC"))
        rows = [
            {
                "text_hash": digest,
                "rubric": label.rubric,
                "prompt_version": label.prompt_version,
                "model": label.model,
                "scores": json.dumps(label.scores, sort_keys=True),
                "quality": label.quality,
                "id": label.id,
                "source": label.source,
                "labelled_at": now.as_py(),
                **{f"score_{dim}": label.scores.get(dim) for dim in DIMENSIONS},
            }
            for digest, label in labels
        ]
        return self._write(pa.Table.from_pylist(rows, schema=CACHE_SCHEMA))

    def compact(self, above: int) -> int:
        """Merge the batch files into one when there are more than `above`; returns the files merged."""
        parts = self.parts()
        if len(parts) <= above:
            return 0
        table = ds.dataset(parts, filesystem=self.lake.fs, format="parquet").to_table()
        self._write(table)
        for part in parts:
            self.lake.fs.rm(part)
        return len(parts)

    def remove_temporaries(self) -> None:
        """Batches a killed run was writing (one labelling run writes the cache at a time)."""
        self.lake.remove_temporaries(self.stage, None)

    def _write(self, table: pa.Table) -> str:
        name = f"part-{time.time_ns():020d}-{uuid.uuid4().hex[:8]}.parquet"
        final = posixpath.join(self.folder, name)
        # Written as a hidden `.partial` that no `*.parquet` glob (the catalog's view) matches.
        with atomic_write(final, self.lake.fs) as handle:
            pq.write_table(table, handle, compression="zstd")
        return final
