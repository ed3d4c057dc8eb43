"""A trained run scored on named evaluation sets, at its newest checkpoints.

`evaluate_on_sets` scores each of the run's newest `checkpoints` checkpoints on each set (a folder with
`heldout.parquet` and `mixture.json`, as the mixture build and moe_dag/mixture/neutral.py write
them) and leaves, per (set, step), `eval.json` and `eval_documents.parquet` under
`<run>/eval_sets/<set>/step_<N>/`. A score is reused while the set's documents are unchanged (a digest
of its `heldout.parquet` is kept beside it), so a rerun evaluates only what is new. Two checkpoints
give the comparisons a gain at two budgets, from which they read its trend (compare.py).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from moe_dag.training.checkpoint import list_checkpoints
from moe_dag.training.evaluate import EVAL_DOCUMENTS_FILE, EVAL_FILE, evaluate_checkpoint, write_evaluation

SETS_DIR = "eval_sets"
_DIGEST_FILE = "set_digest"


def _digest(data_dir: Path) -> str:
    return hashlib.sha256((Path(data_dir) / "heldout.parquet").read_bytes()).hexdigest()


def set_folder(run_dir: Path, name: str, step: int) -> Path:
    return Path(run_dir) / SETS_DIR / name / f"step_{step}"


def evaluate_on_sets(
    run_dir: Path, sets: dict[str, Path], *, checkpoints: int = 1, device: str = "cpu"
) -> dict[str, dict[int, dict[str, Any]]]:
    """{set: {step: figures}} for the newest `checkpoints` checkpoints of `run_dir` (oldest first)."""
    found = list_checkpoints(run_dir)[-checkpoints:]
    if not found:
        raise ValueError(f"{run_dir}: no finished checkpoint to evaluate")
    results: dict[str, dict[int, dict[str, Any]]] = {}
    for name, data_dir in sets.items():
        digest = _digest(data_dir)
        results[name] = {}
        for checkpoint in found:
            step = int(checkpoint.name.removeprefix("step_"))
            folder = set_folder(run_dir, name, step)
            marker = folder / _DIGEST_FILE
            if marker.exists() and marker.read_text() == digest and (folder / EVAL_FILE).exists():
                results[name][step] = json.loads((folder / EVAL_FILE).read_text())
                continue
            figures = evaluate_checkpoint(checkpoint, Path(data_dir), device=device)
            results[name][step] = write_evaluation(figures, folder / EVAL_FILE, folder / EVAL_DOCUMENTS_FILE)
            marker.write_text(digest)
    return results
