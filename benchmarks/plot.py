"""The PNG: records per second against MAX_CONCURRENCY, with the sequential alternatives as flat lines."""

from __future__ import annotations

from pathlib import Path

from benchmarks.throughput import Result


def plot(sweep: list[Result], flat: list[Result], ideal: dict[int, float], path: Path) -> None:
    """Write the throughput plot to ``path`` (matplotlib, Agg backend: no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.5), dpi=110)
    levels = [result.concurrency for result in sweep]
    axes.plot(levels, [r.per_second for r in sweep], "o-", label="this worker (MAX_CONCURRENCY)")
    axes.plot(levels, [ideal[c] for c in levels], ":", color="grey", label="ideal: calls x 20 ms / concurrency")
    for result, style, colour in zip(flat, ("--", "-.", "-"), ("tab:red", "tab:orange", "tab:green"), strict=False):
        axes.axhline(result.per_second, linestyle=style, color=colour, alpha=0.8, label=result.name)
    axes.set_xscale("log", base=2)
    axes.set_yscale("log")
    axes.set_xticks(levels, [str(level) for level in levels])
    axes.set_xlabel("concurrency")
    axes.set_ylabel("records / s")
    axes.set_title("Session cleanup throughput, moto over HTTP behind a 20 ms proxy")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
