"""`kiln bench`'s bar chart (PNG): latency and compile seconds per engine, from bench.json.

matplotlib is optional: the GPU machine may not have it, and nothing can be installed there, so
without it the chart is the one thing left out, said in one line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.render import ENGINE_TITLES, STEP_TITLES

CHART_STEPS = ("cold", "warm", "layer_edit", "weight_swap")


def number(steps: dict[str, Any], step: str, key: str) -> float | None:
    value = steps.get(step, {}).get(key)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def write_chart(bench: dict[str, Any], path: Path) -> str:
    """Draw the chart to path; a line that says where it went, or why there is none."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "no chart: matplotlib is not installed here (bench.json and the tables are complete)"
    engines = bench["engines"]
    titles = [ENGINE_TITLES.get(name, name) for name in engines]
    figure, (latency, compiles) = plt.subplots(1, 2, figsize=(12, 4.5))
    medians = [number(steps, "latency", "median_ms") for steps in engines.values()]
    bars = latency.bar(titles, [m or 0.0 for m in medians], color="tab:blue")
    latency.bar_label(bars, labels=[f"{m:.3g}" if m is not None else "n/a" for m in medians])
    latency.set_title(f"latency, ms (median of {bench['runs']})")
    width = 0.8 / len(CHART_STEPS)
    for i, step in enumerate(CHART_STEPS):
        values = [number(steps, step, "seconds") for steps in engines.values()]
        spots = [k + (i - (len(CHART_STEPS) - 1) / 2) * width for k in range(len(titles))]
        bars = compiles.bar(spots, [v or 0.0 for v in values], width, label=STEP_TITLES[step])
        compiles.bar_label(bars, labels=[f"{v:.3g}" if v is not None else "" for v in values], fontsize=7)
    compiles.set_xticks(range(len(titles)), titles)
    compiles.set_title("compile, s (fresh process; missing bar: not measured)")
    compiles.legend()
    figure.suptitle(f"kiln bench {bench['model']} ({bench['target']})")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return f"wrote {path}"
