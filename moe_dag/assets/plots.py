"""Plots shown in the Dagster UI, embedded in markdown metadata as PNG data URLs."""

import base64
import io
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display: assets run in worker processes and CI
import matplotlib.pyplot as plt  # noqa: E402


def png_markdown(png: bytes | Path, title: str) -> str:
    data = png.read_bytes() if isinstance(png, Path) else png
    return f"![{title}](data:image/png;base64,{base64.b64encode(data).decode()})"


def scatter_png(x: list[float], y: list[float], x_label: str, y_label: str, title: str) -> bytes:
    figure, axes = plt.subplots(figsize=(4.5, 4))
    axes.scatter(x, y, s=8, alpha=0.6)
    axes.plot([0, 1], [0, 1], color="grey", linewidth=1, linestyle="--")
    axes.set(xlabel=x_label, ylabel=y_label, title=title, xlim=(0, 1), ylim=(0, 1))
    return _to_png(figure)


def bars_png(labels: list[str], series: dict[str, list[float]], y_label: str, title: str) -> bytes:
    """Grouped bars, one group per label and one bar per series (e.g. target vs achieved share)."""
    figure, axes = plt.subplots(figsize=(5, 3.5))
    width = 0.8 / max(len(series), 1)
    for index, (name, values) in enumerate(series.items()):
        positions = [i + index * width for i in range(len(labels))]
        axes.bar(positions, values, width=width, label=name)
    axes.set_xticks([i + width * (len(series) - 1) / 2 for i in range(len(labels))], labels)
    axes.set(ylabel=y_label, title=title)
    axes.legend()
    return _to_png(figure)


def _to_png(figure: plt.Figure) -> bytes:
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=90)
    plt.close(figure)
    return buffer.getvalue()
