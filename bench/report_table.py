"""What the backend benchmarks share: reading nested results and printing them as a table."""

from __future__ import annotations

from typing import Any

Columns = tuple[tuple[str, tuple[str, ...]], ...]


def pick(result: dict[str, Any], *keys: str) -> float | None:
    value: Any = result
    for key in keys:
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return float(value) if isinstance(value, int | float) else None


def ratio(num: float | None, den: float | None) -> float | None:
    return None if num is None or not den else round(num / den, 3)


def cell(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.2e}" if 0 < abs(value) < 1e-3 else f"{value:.3f}"


def table(results: list[dict[str, Any]], columns: Columns, width: int = 15) -> str:
    """One row per model; each column the value at its keys (pick), formatted by cell."""
    first = max(len("model"), *(len(r["model"]) for r in results))
    head = "model".ljust(first) + "".join(f"  {name:>{width}}" for name, _ in columns)
    lines = [head, "-" * len(head)]
    for r in results:
        cells = "".join(f"  {cell(pick(r, *keys)):>{width}}" for _, keys in columns)
        lines.append(r["model"].ljust(first) + cells)
    return "\n".join(lines)
