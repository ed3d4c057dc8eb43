"""What a training run leaves in its output folder besides checkpoints: metrics, summary, loss plot.

- `metrics.jsonl`: one JSON object per optimizer step (step, loss, lr, grad_norm, tokens_per_s,
  load_imbalance: max/mean expert load per MoE layer). On resume, lines after the checkpoint's step
  are dropped first, so a rerun rewrites exactly the steps it redoes. A process killed while appending
  leaves a torn last line (no newline): reading skips it and truncating cuts it off.
- `summary.json`: final loss, steps, tokens, time, parameter counts, the config.
- `loss.png`: the training loss curve.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

log = logging.getLogger(__name__)


class MetricsLog:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def read(self) -> list[dict[str, Any]]:
        """Every complete record. A torn last line is skipped; a bad line anywhere else is an error."""
        if not self.path.exists():
            return []
        text = self.path.read_text()
        lines = text.split("\n")
        # Each record is written with its newline in one call, so only a torn write lacks it.
        torn = lines.pop()
        if torn.strip():
            log.warning("%s: ignoring a torn last line (%d characters)", self.path, len(torn))
        records = []
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as error:
                raise ValueError(f"{self.path} line {number}: not a JSON record ({error})") from error
        return records

    def truncate_after(self, step: int) -> None:
        kept = [record for record in self.read() if record["step"] <= step]
        self.path.write_text("".join(json.dumps(record) + "\n" for record in kept))

    def append(self, record: dict[str, Any]) -> None:
        with self.path.open("a") as handle:
            handle.write(json.dumps(record) + "\n")


def write_summary(path: Path, summary: dict[str, Any]) -> None:
    tmp = Path(path).with_suffix(".tmp")
    tmp.write_text(json.dumps(summary, indent=2) + "\n")
    tmp.replace(path)


def plot_loss(records: list[dict[str, Any]], path: Path, title: str) -> None:
    # A bare Figure, not pyplot: no global backend state, no display needed.
    fig = Figure(figsize=(7, 4))
    ax = fig.subplots()
    ax.plot([r["step"] for r in records], [r["loss"] for r in records], linewidth=1)
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (nats / token)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
