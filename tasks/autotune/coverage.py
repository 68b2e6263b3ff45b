"""What autotune covered: how many kernels were tuned of all, and how many of those sit inside
control flow (a cond branch, a while_loop's condition or body)."""

from __future__ import annotations

from typing import Any

from tasks.schedule.model import MAIN


def with_places(records: dict[str, Any], entries: list[dict[str, Any]]) -> dict[str, Any]:
    """Each kernel's record with where its launches sit (kernels.json's places).

    Note: places are added here, not kept in the cached record: the same kernel one branch
    further in is the same cache item."""
    places = {e["key"]: e.get("places", []) for e in entries}
    return {key: r | {"places": places.get(key, [])} for key, r in records.items()}


def inside_control_flow(record: dict[str, Any]) -> bool:
    return any(place != MAIN for place in record.get("places", []))


def coverage(records: dict[str, Any]) -> dict[str, int]:
    every = list(records.values())
    inside = [r for r in every if inside_control_flow(r)]
    return {"kernels": len(every), "tuned": _tuned(every), "in_control_flow": len(inside),
            "in_control_flow_tuned": _tuned(inside)}


def _tuned(records: list[dict[str, Any]]) -> int:
    return sum(bool(r.get("tuned", True)) for r in records)


def coverage_text(c: dict[str, int]) -> str:
    """"kernels tuned 12 of 12, of which 7 inside control flow"."""
    text = f"kernels tuned {c['tuned']} of {c['kernels']}"
    if c["in_control_flow"]:
        text += f", of which {c['in_control_flow_tuned']} inside control flow"
    return text
