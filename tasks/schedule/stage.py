"""The schedule stage's entry: ir.json -> schedule.json, schedule.txt and a debug dump per pass."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from contract.job import StageJob
from contract.units import human_bytes
from tasks.ir import serialize
from tasks.ir.nodes import Extern, Fallback
from tasks.schedule import model
from tasks.schedule.model import CallStep, Schedule, ScheduledGraph, subgraphs
from tasks.schedule.passes import schedule_program
from tasks.schedule.text import schedule_text

SCHEDULE = "schedule.json"
SCHEDULE_TEXT = "schedule.txt"
IR = "lower/ir.json"


def run(job: StageJob) -> Mapping[str, Any]:
    graph = serialize.loads(job.input(IR).read_bytes())
    schedule, dumps = schedule_program(graph)
    out = job.out_dir
    (out / SCHEDULE).write_bytes(model.dumps(schedule))
    (out / SCHEDULE_TEXT).write_text(schedule_text(schedule))
    for name, text in dumps.items():
        path = out / "passes" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return stats(schedule)


def _graphs(g: ScheduledGraph) -> list[ScheduledGraph]:
    found = [g]
    for step in g.steps:
        for _, sub in subgraphs(step):
            found += _graphs(sub)
    return found


def stats(schedule: Schedule) -> dict[str, Any]:
    graphs = _graphs(schedule.main)
    calls = [s.node for g in graphs for s in g.steps if isinstance(s, CallStep)]
    fallbacks = sorted({n.target for n in calls if isinstance(n, Fallback)})
    externs = sum(isinstance(n, Extern) for n in calls)
    arena = sum(g.arena_bytes for g in graphs)
    total = sum(b.nbytes for g in graphs for b in g.buffers if b.name in dict(g.arena))
    unique = len({k.key for k in schedule.kernels})
    note = f"{len(schedule.kernels)} kernels ({unique} distinct), {externs} extern"
    if fallbacks:
        note += f", {len(fallbacks)} not compiled"
    note += f"; arena {human_bytes(arena)} of {human_bytes(total)}"
    return {"kernels": len(schedule.kernels), "distinct_kernels": unique, "externs": externs,
            "fallbacks": fallbacks, "arena_bytes": arena, "temp_bytes": total, "summary": note}
