"""Issue 35, item 11: a full lake disk during ingest named the input shard only ('shard .../a.jsonl:
OSError: [Errno 28] No space left on device'), not the file that could not be written."""

import errno
import json

import pyarrow.parquet as pq
import pytest

from moe_dag.curation.ingest import ingest_source
from moe_dag.storage.lake import Lake


def test_a_full_disk_names_the_output_file(tmp_path, monkeypatch):
    corpus, lake = tmp_path / "web", Lake(tmp_path / "lake")
    corpus.mkdir()
    (corpus / "a.jsonl").write_text(
        "".join(json.dumps({"id": f"{i}", "text": f"text {i}"}) + "\n" for i in range(5))
    )

    def disk_full(self, table, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pq.ParquetWriter, "write_table", disk_full)
    output = tmp_path / "lake" / "raw_documents" / "source=web" / "a.parquet"
    with pytest.raises(Exception, match=rf"could not write {output}: \[Errno 28\] No space left on device"):
        run = ingest_source(lake, "web", str(corpus), workers=0)
        raise RuntimeError(str(run))
