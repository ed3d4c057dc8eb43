"""The one atomic-write helper: a failed write leaves no temporary file and names the path."""

import errno
import subprocess
import sys
import textwrap

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from moe_dag.storage.atomic import ArtefactWriteError, atomic_path, atomic_write
from moe_dag.storage.lake import Lake


def test_atomic_write_replaces_the_file_in_one_step(tmp_path):
    target = tmp_path / "a" / "manifest.json"
    with atomic_write(str(target)) as handle:
        handle.write(b"first")
        assert not target.exists()  # nothing visible until the write is complete
    with atomic_write(str(target)) as handle:
        handle.write(b"second")
    assert target.read_bytes() == b"second"
    assert [p.name for p in target.parent.iterdir()] == ["manifest.json"]


def test_a_failed_write_removes_its_temporary_and_names_the_path(tmp_path):
    target = tmp_path / "heads.safetensors"
    target.write_bytes(b"the old artefact")
    with (
        pytest.raises(ArtefactWriteError, match="heads.safetensors") as failure,
        atomic_write(str(target)) as handle,
    ):
        handle.write(b"half of it")
        raise OSError(errno.ENOSPC, "No space left on device")
    assert failure.value.errno == errno.ENOSPC and isinstance(failure.value, OSError)
    assert str(target) in str(failure.value)
    assert target.read_bytes() == b"the old artefact"
    assert [p.name for p in tmp_path.iterdir()] == ["heads.safetensors"]


def test_atomic_path_serves_writers_that_take_a_path(tmp_path):
    target = tmp_path / "checkpoint.pt"
    with pytest.raises(ArtefactWriteError, match="checkpoint.pt"), atomic_path(target) as partial:
        partial.write_bytes(b"x")
        # torch.save reports a full disk as this, without the path
        raise RuntimeError("basic_ios::clear: iostream error")
    assert list(tmp_path.iterdir()) == []
    with atomic_path(target) as partial:
        partial.write_bytes(b"done")
    assert target.read_bytes() == b"done" and list(tmp_path.iterdir()) == [target]


def test_lake_write_on_a_full_disk_leaves_nothing_behind(tmp_path):
    """A real write failure: a file-size limit makes the kernel refuse the write (EFBIG), as ENOSPC does."""
    lake_root = tmp_path / "lake"
    script = textwrap.dedent(
        f"""
        import resource, signal
        import pyarrow as pa
        from moe_dag.storage.lake import Lake
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))
        table = pa.table({{"source": ["a"] * 20_000, "text": [str(i) * 40 for i in range(20_000)]}})
        Lake({str(lake_root)!r}).write_table(table, "stage")
        """
    )
    failed = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert failed.returncode != 0
    assert "ArtefactWriteError" in failed.stderr and str(lake_root / "stage") in failed.stderr
    assert [p.name for p in (lake_root / "stage").iterdir()] == []

    Lake(lake_root).write_table(pa.table({"source": ["a"], "text": ["fits"]}), "stage")
    (written,) = (lake_root / "stage").iterdir()
    assert not written.name.startswith(".") and pq.read_table(written)["text"].to_pylist() == ["fits"]
