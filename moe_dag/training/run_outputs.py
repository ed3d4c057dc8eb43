"""What a training run leaves in its output folder besides checkpoints: metrics, summary, loss plot.

- `metrics.jsonl`: one JSON object per optimizer step (step, loss, lr, grad_norm, tokens_per_s,
  load_imbalance: max/mean expert load per MoE layer). Each checkpoint keeps a copy of the records up
  to its step; on resume the file is replaced by that copy, so a rerun rewrites exactly the steps it
  redoes and every step appears once with the values first written, whichever line was torn or lost
  since. A process killed while appending leaves a torn last line (no newline): reading skips it.
- `summary.json`: final loss, steps, tokens, time, parameter counts, the config.
- `loss.png`, `expert_load.png`, `source_shares.png`: the training loss, the max/mean expert load per
  MoE layer, and each source's share of the tokens trained on so far against its target.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"


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

    def replace(self, records: list[dict[str, Any]]) -> None:
        """The file holds exactly `records`, swapped in by one rename."""
        partial = self.path.with_name(f".{self.path.name}.partial")
        partial.write_text("".join(json.dumps(record) + "\n" for record in records))
        partial.replace(self.path)

    def restore(self, checkpoint: Path | None) -> None:
        """The records up to `checkpoint`'s step as it saved them; none for a run with no checkpoint."""
        self.replace(MetricsLog(Path(checkpoint) / METRICS_FILE).read() if checkpoint else [])

    def append(self, record: dict[str, Any]) -> None:
        with self.path.open("a") as handle:
            handle.write(json.dumps(record) + "\n")


def write_summary(path: Path, summary: dict[str, Any]) -> None:
    tmp = Path(path).with_suffix(".tmp")
    tmp.write_text(json.dumps(summary, indent=2) + "\n")
    tmp.replace(path)


def write_plots(
    records: list[dict[str, Any]], out_dir: Path, *, title: str, target_shares: dict[str, float]
) -> list[Path]:
    """loss.png, expert_load.png and (when the mixture counts sources) source_shares.png; returns them."""
    out_dir = Path(out_dir)
    written = [plot_loss(records, out_dir / "loss.png", title=title)]
    if any(record["load_imbalance"] for record in records):
        written.append(plot_expert_load(records, out_dir / "expert_load.png"))
    if any(record.get("source_shares") for record in records):
        written.append(plot_source_shares(records, out_dir / "source_shares.png", target_shares))
    return written


def plot_loss(records: list[dict[str, Any]], path: Path, title: str) -> Path:
    fig, ax = _figure()
    ax.plot([r["step"] for r in records], [r["loss"] for r in records], linewidth=1)
    ax.set(xlabel="step", ylabel="training loss (nats / token)", title=title)
    return _save(fig, path)


def plot_expert_load(records: list[dict[str, Any]], path: Path) -> Path:
    """Max over mean tokens per expert, per MoE layer: 1.0 is perfect balance."""
    fig, ax = _figure()
    steps = [r["step"] for r in records]
    for layer in range(len(records[-1]["load_imbalance"])):
        ax.plot(steps, [r["load_imbalance"][layer] for r in records], linewidth=1, label=f"MoE layer {layer}")
    ax.axhline(1.0, color="grey", linewidth=1, linestyle="--")
    ax.set(xlabel="step", ylabel="max / mean tokens per expert", title="expert load")
    ax.legend(fontsize=8)
    return _save(fig, path)


def plot_source_shares(records: list[dict[str, Any]], path: Path, target_shares: dict[str, float]) -> Path:
    """The share of each source in all tokens trained on up to each step, against its target."""
    fig, ax = _figure()
    with_shares = [r for r in records if r.get("source_shares")]
    steps = [r["step"] for r in with_shares]
    for index, source in enumerate(sorted(with_shares[-1]["source_shares"])):
        color = f"C{index}"
        ax.plot(steps, [r["source_shares"].get(source, 0.0) for r in with_shares], color=color, label=source)
        if source in target_shares:
            ax.axhline(target_shares[source], color=color, linewidth=1, linestyle="--")
    ax.set(xlabel="step", ylabel="share of tokens trained on", title="source shares (dashed: target)")
    ax.legend(fontsize=8)
    return _save(fig, path)


def _figure() -> tuple[Figure, Any]:
    # A bare Figure, not pyplot: no global backend state, no display needed.
    fig = Figure(figsize=(7, 4))
    ax = fig.subplots()
    ax.grid(alpha=0.3)
    return fig, ax


def _save(fig: Figure, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return Path(path)
