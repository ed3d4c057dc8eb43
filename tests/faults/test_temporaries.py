"""Issue 23, item 10: a write killed halfway (a label-cache batch, a stage's shard file, a checkpoint)
leaves a temporary that no reader takes for data and that the next writer removes. The kills are real:
the writing process kills itself in the middle of the file."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np

from moe_dag.curation.ingest import ingest_source
from moe_dag.quality.oracle import LabelCache, LabellingConfig, LabelRequest, RuleBasedOracle, label_documents
from moe_dag.storage.catalog import LAKE_STAGES, Catalog
from moe_dag.storage.lake import Lake
from moe_dag.training.trainer import train
from tests.test_trainer import SEQ_LEN, fast_config, write_mixture

REPOSITORY = Path(__file__).parents[2]

# Patches pyarrow's parquet writers to write the magic bytes and some junk, then SIGKILL their process.
KILL_MID_WRITE = textwrap.dedent(
    """
    import os, signal, sys
    import pyarrow.parquet as pq
    sys.path.insert(0, {repository!r})

    def die_halfway(table, where, *args, **kwargs):
        where.write(b"PAR1" + b"half a row group" * 1000)
        where.flush()
        os.kill(os.getpid(), signal.SIGKILL)

    class DyingWriter:
        def __init__(self, where, *args, **kwargs):
            self.where = where
        def write_table(self, table):
            die_halfway(table, self.where)
        def close(self):
            pass

    pq.write_table, pq.ParquetWriter = die_halfway, DyingWriter
    """
)


def _killed_while_writing(script: str) -> None:
    code = KILL_MID_WRITE.format(repository=str(REPOSITORY)) + textwrap.dedent(script)
    died = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert died.returncode == -9, died.stderr[-2000:]


def _requests(count: int) -> list[LabelRequest]:
    return [
        LabelRequest(id=f"d{i}", text=f"some text {i}", source="web", rubric="general") for i in range(count)
    ]


def test_a_label_cache_batch_killed_mid_write_breaks_no_reader_and_is_removed(tmp_path):
    lake = Lake(tmp_path / "lake")
    label_documents(_requests(3), RuleBasedOracle(), LabelCache(lake), LabellingConfig())
    _killed_while_writing(
        f"""
        from moe_dag.storage.lake import Lake
        from moe_dag.quality.oracle import (
            LabelCache, LabellingConfig, LabelRequest, RuleBasedOracle, label_documents,
        )
        requests = [LabelRequest(id=f"e{{i}}", text=f"other text {{i}}", source="web", rubric="general")
                    for i in range(3)]
        label_documents(requests, RuleBasedOracle(), LabelCache(Lake({str(lake.url)!r})), LabellingConfig())
        """
    )
    cache_dir = tmp_path / "lake" / "oracle_label_cache"
    assert [p.name for p in cache_dir.iterdir() if p.name.startswith(".")]  # the half batch is there
    catalog = Catalog(tmp_path / "catalog.duckdb", lake)
    assert "oracle_label_cache" in catalog.refresh({"oracle_label_cache": LAKE_STAGES["oracle_label_cache"]})
    assert catalog.query("SELECT count(*) FROM oracle_label_cache") == [(3,)]

    report = label_documents(_requests(3), RuleBasedOracle(), LabelCache(lake), LabellingConfig())
    assert report.from_cache == 3
    assert not [p.name for p in cache_dir.iterdir() if p.name.startswith(".")]


def test_a_stage_shard_killed_mid_write_breaks_no_reader_and_is_removed(tmp_path):
    corpus, lake = tmp_path / "corpus", Lake(tmp_path / "lake")
    corpus.mkdir()
    for shard, words in [("a", "one two"), ("b", "three four"), ("c", "five six")]:
        if shard == "c":  # a shard that arrives later: its run is the one killed
            ingest_source(lake, "web", str(corpus), workers=0)
        (corpus / f"{shard}.jsonl").write_text(json.dumps({"id": shard, "text": words}) + "\n")
    _killed_while_writing(
        f"""
        from moe_dag.curation.ingest import ingest_source
        from moe_dag.storage.lake import Lake
        ingest_source(Lake({str(lake.url)!r}), "web", {str(corpus)!r}, workers=0)
        """
    )
    folder = tmp_path / "lake" / "raw_documents" / "source=web"
    assert [p.name for p in folder.iterdir() if p.name.startswith(".tmp-")]
    catalog = Catalog(tmp_path / "catalog.duckdb", lake)
    catalog.refresh({"raw_documents": True})
    assert catalog.query("SELECT count(*) FROM raw_documents") == [(2,)]
    assert ingest_source(lake, "web", str(corpus), workers=0).shards_run == 1
    assert not [p.name for p in folder.iterdir() if p.name.startswith(".tmp-")]
    assert catalog.query("SELECT count(*) FROM raw_documents") == [(3,)]


def test_a_checkpoint_killed_mid_save_is_removed_by_the_next_save(tmp_path):
    rows = (np.arange(24)[:, None] + np.arange(SEQ_LEN + 1)[None, :]) % 12 + 1
    data = write_mixture(tmp_path / "data", rows)
    out = tmp_path / "run"
    unfinished = out / "checkpoints" / ".step_3.tmp"
    unfinished.mkdir(parents=True)
    (unfinished / "scheduler.pt").write_bytes(b"half")
    train(fast_config(2, checkpoint_every=2), data, out)
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_2"]
