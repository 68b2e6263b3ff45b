"""What autotune covered: how many kernels were tuned of all, and how many of those sit inside
control flow (a cond branch, a while_loop's condition or body)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from contract.timings import TimingRecord
from tasks.gen_tuning.spec import KernelHead
from tasks.schedule.model import MAIN


def placed(record: Mapping[str, Any], entry: KernelHead, function: str) -> TimingRecord:
    """A tuner's record of one kernel, with the kernel's names, origins and places.

    Note: these are added here, not kept in the cached record: the same kernel one branch
    further in, or one layer further down, is the same cache item."""
    return dataclasses.replace(TimingRecord.from_json(record), function=function, names=entry.names,
                               origins=entry.origins, places=entry.places)


def inside_control_flow(record: TimingRecord) -> bool:
    return any(place != MAIN for place in record.places)


def coverage(records: Mapping[str, TimingRecord]) -> dict[str, int]:
    every = list(records.values())
    inside = [r for r in every if inside_control_flow(r)]
    return {"kernels": len(every), "tuned": _tuned(every), "in_control_flow": len(inside),
            "in_control_flow_tuned": _tuned(inside)}


def _tuned(records: list[TimingRecord]) -> int:
    return sum(r.tuned for r in records)


def coverage_text(c: dict[str, int]) -> str:
    """"kernels tuned 12 of 12, of which 7 inside control flow"."""
    text = f"kernels tuned {c['tuned']} of {c['kernels']}"
    if c["in_control_flow"]:
        text += f", of which {c['in_control_flow_tuned']} inside control flow"
    return text
