"""Issue 23, items 2, 11 and 12: a checkpoint is verified against its manifest before anything in it is
unpickled; metrics resume exactly whichever line was torn; a full disk while checkpointing says which
checkpoint and leaves no temporary folder."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from moe_dag.training.checkpoint import CheckpointIntegrityError, latest_checkpoint, load_model
from moe_dag.training.trainer import train
from tests.test_trainer import SEQ_LEN, fast_config, write_mixture


@pytest.fixture
def data(tmp_path: Path) -> Path:
    rows = (np.arange(24)[:, None] + np.arange(SEQ_LEN + 1)[None, :]) % 12 + 1
    return write_mixture(tmp_path / "data", rows)


class _MakesADirectory:
    """A pickle that runs code when loaded, as a crafted `.metadata` would."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (os.mkdir, (str(self.marker),))


def test_a_checkpoint_lists_every_file_with_its_sha256(data: Path, tmp_path: Path) -> None:
    train(fast_config(2, checkpoint_every=2), data, tmp_path / "run")
    checkpoint = latest_checkpoint(tmp_path / "run")
    manifest = json.loads((checkpoint / "manifest.json").read_text())
    files = {str(p.relative_to(checkpoint)) for p in checkpoint.rglob("*") if p.is_file()}
    assert set(manifest["files"]) == files - {"manifest.json"}
    assert "state/.metadata" in manifest["files"]
    assert all(len(entry["sha256"]) == 64 for entry in manifest["files"].values())


@pytest.mark.parametrize("reader", ["load_model", "resume"])
def test_a_replaced_metadata_pickle_is_refused_before_it_is_loaded(
    data: Path, tmp_path: Path, reader: str
) -> None:
    out = tmp_path / "run"
    train(fast_config(2, checkpoint_every=2), data, out)
    checkpoint = latest_checkpoint(out)
    marker = tmp_path / "pwned"
    (checkpoint / "state" / ".metadata").write_bytes(pickle.dumps(_MakesADirectory(marker)))
    with pytest.raises(CheckpointIntegrityError, match=r"state/\.metadata.*does not match"):
        if reader == "load_model":
            load_model(checkpoint)
        else:
            train(fast_config(4, checkpoint_every=2), data, out)
    assert not marker.exists()


def test_a_file_missing_added_or_without_manifest_is_refused(data: Path, tmp_path: Path) -> None:
    train(fast_config(2, checkpoint_every=2), data, tmp_path / "run")
    checkpoint = latest_checkpoint(tmp_path / "run")
    (checkpoint / "state" / "extra.distcp").write_bytes(b"x")
    with pytest.raises(CheckpointIntegrityError, match="extra.distcp.*not in its manifest"):
        load_model(checkpoint)
    (checkpoint / "state" / "extra.distcp").unlink()
    (checkpoint / "scheduler.pt").unlink()
    with pytest.raises(CheckpointIntegrityError, match="scheduler.pt.*missing"):
        load_model(checkpoint)
    (checkpoint / "manifest.json").unlink()
    with pytest.raises(CheckpointIntegrityError, match="no manifest.json"):
        load_model(checkpoint)


@pytest.mark.parametrize("torn_step", [1, 3, 5])
def test_metrics_resume_exactly_whichever_line_is_torn(data: Path, tmp_path: Path, torn_step: int) -> None:
    """The file cut inside step `torn_step`'s line, the newest checkpoint at step 4 (6 steps in all)."""
    out = tmp_path / "run"
    config = fast_config(6, checkpoint_every=2, keep_checkpoints=3)
    train(config, data, out)
    uninterrupted = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]

    shutil.rmtree(out / "checkpoints" / "step_6")
    lines = (out / "metrics.jsonl").read_text().splitlines(keepends=True)
    line = lines[torn_step - 1]
    (out / "metrics.jsonl").write_text("".join(lines[: torn_step - 1]) + line[: len(line) // 2])
    train(config, data, out)

    resumed = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in resumed] == [1, 2, 3, 4, 5, 6]
    # Up to the checkpoint every value is the one the uninterrupted run wrote; after it, the redone steps.
    assert resumed[:4] == uninterrupted[:4]
    assert [r["loss"] for r in resumed] == [r["loss"] for r in uninterrupted]


def test_a_full_disk_while_checkpointing_names_the_checkpoint_and_leaves_no_temporary(
    data: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    script = textwrap.dedent(
        f"""
        import resource, signal, sys
        sys.path.insert(0, {str(Path(__file__).parents[2])!r})
        from tests.test_trainer import fast_config
        from moe_dag.training.trainer import train
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))
        train(fast_config(2, checkpoint_every=2), {str(data)!r}, {str(out)!r})
        """
    )
    failed = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert failed.returncode != 0
    last_line = failed.stderr.strip().splitlines()[-1]
    assert "CheckpointWriteError" in last_line and str(out / "checkpoints" / "step_2") in last_line
    assert list((out / "checkpoints").iterdir()) == []
