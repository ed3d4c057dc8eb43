"""Two evaluated runs compared on the same held-out documents: the proxy's gain over a baseline.

    gain = baseline bits per byte - proxy bits per byte        (positive: the proxy predicts better)

per source and overall, each with a 95% paired bootstrap interval (bootstrap.py): both models are scored
on the same resampled documents, so the interval reflects how consistently one beats the other, not how
hard the held-out documents happen to be. The inputs are the runs' `eval_documents.parquet`.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from moe_dag.training.bootstrap import paired_difference_interval
from moe_dag.training.evaluate import EVAL_DOCUMENTS_FILE


def read_document_losses(run_dir: Path) -> pa.Table:
    path = Path(run_dir) / EVAL_DOCUMENTS_FILE
    if not path.exists():
        raise ValueError(f"{path}: not found; the run was not evaluated (train with --eval-on)")
    return pq.read_table(path)


def compare_runs(proxy: pa.Table, baseline: pa.Table, *, seed: int = 0) -> dict[str, Any]:
    """{"overall": figures, "sources": {source: figures}} with figures proxy_bits_per_byte,
    baseline_bits_per_byte, gain, gain_ci, documents; both tables must score the same documents."""
    order = [("source", "ascending"), ("id", "ascending")]
    proxy, baseline = proxy.sort_by(order), baseline.sort_by(order)
    for column in ("source", "id", "num_bytes"):
        if proxy[column] != baseline[column]:
            raise ValueError(f"the two runs were scored on different held-out documents ({column} differs)")
    sources_N = np.asarray(proxy["source"].to_pylist())
    proxy_bits_N = proxy["nll_nats"].to_numpy() / math.log(2)
    baseline_bits_N = baseline["nll_nats"].to_numpy() / math.log(2)
    bytes_N = proxy["num_bytes"].to_numpy().astype(np.float64)

    def figures(mask: np.ndarray, strata: np.ndarray | None) -> dict[str, Any]:
        proxy_bpb = proxy_bits_N[mask].sum() / bytes_N[mask].sum()
        baseline_bpb = baseline_bits_N[mask].sum() / bytes_N[mask].sum()
        interval = paired_difference_interval(
            baseline_bits_N[mask], proxy_bits_N[mask], bytes_N[mask], strata, seed=seed
        )
        return {
            "proxy_bits_per_byte": float(proxy_bpb),
            "baseline_bits_per_byte": float(baseline_bpb),
            "gain": float(baseline_bpb - proxy_bpb),
            "gain_ci": list(interval),
            "documents": int(mask.sum()),
        }

    every = np.ones(len(sources_N), dtype=bool)
    return {
        "overall": figures(every, sources_N),
        "sources": {source: figures(sources_N == source, None) for source in sorted(set(sources_N.tolist()))},
    }
