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


def scatter_png(
    x: list[float],
    y: list[float],
    x_label: str,
    y_label: str,
    title: str,
    limits: tuple[float, float] = (0, 1),
) -> bytes:
    """Points against the diagonal y = x, both axes over `limits`."""
    figure, axes = plt.subplots(figsize=(4.5, 4))
    axes.scatter(x, y, s=8, alpha=0.6)
    axes.plot(limits, limits, color="grey", linewidth=1, linestyle="--")
    axes.set(xlabel=x_label, ylabel=y_label, title=title, xlim=limits, ylim=limits)
    return _to_png(figure)


def bars_png(
    labels: list[str],
    series: dict[str, list[float]],
    y_label: str,
    title: str,
    intervals: dict[str, list[tuple[float, float]]] | None = None,
) -> bytes:
    """Grouped bars, one group per label and one bar per series (e.g. target vs achieved share); with
    `intervals`, each bar carries an error bar from its (low, high)."""
    figure, axes = plt.subplots(figsize=(5, 3.5))
    width = 0.8 / max(len(series), 1)
    for index, (name, values) in enumerate(series.items()):
        positions = [i + index * width for i in range(len(labels))]
        errors = None
        if intervals is not None:
            lows, highs = zip(*intervals[name], strict=True)
            errors = [
                [value - low for value, low in zip(values, lows, strict=True)],
                [high - value for value, high in zip(values, highs, strict=True)],
            ]
        axes.bar(positions, values, width=width, label=name, yerr=errors, capsize=3)
    axes.set_xticks([i + width * (len(series) - 1) / 2 for i in range(len(labels))], labels)
    axes.set(ylabel=y_label, title=title)
    axes.legend()
    return _to_png(figure)


def curves_png(
    curves: dict[str, tuple[list[float], list[float]]], x_label: str, y_label: str, title: str
) -> bytes:
    """One line per named (x, y) curve, e.g. the training loss of two runs."""
    figure, axes = plt.subplots(figsize=(6, 3.5))
    for name, (x, y) in curves.items():
        axes.plot(x, y, linewidth=1, label=name)
    axes.set(xlabel=x_label, ylabel=y_label, title=title)
    axes.grid(alpha=0.3)
    axes.legend()
    return _to_png(figure)


def _to_png(figure: plt.Figure) -> bytes:
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=90)
    plt.close(figure)
    return buffer.getvalue()
