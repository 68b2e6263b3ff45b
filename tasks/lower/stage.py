"""The lower stage's entry: program.json -> ir.json (canonical) and ir.txt (readable)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pipeline.errors import KilnError
from pipeline.job import StageJob
from tasks.ir import serialize
from tasks.ir.nodes import Extern, Fallback, Graph, Node
from tasks.ir.text import graph_text
from tasks.lower.context import LoweringError
from tasks.lower.program import lower_program

IR = "ir.json"
IR_TEXT = "ir.txt"
PROGRAM = "trace/program.json"


def run(job: StageJob) -> Mapping[str, Any]:
    program_path = job.input(PROGRAM)
    source_map = _source_map(program_path)
    from tasks.trace.program import load_program

    program = load_program(program_path)
    try:
        graph = lower_program(program, source_map)
    except LoweringError as err:
        raise KilnError(f"model {job.model!r}: {err}",
                        "kiln's lowering table (tasks/lower/) has no way to express this") from None
    out = job.out_dir
    (out / IR).write_bytes(serialize.dumps(graph))
    (out / IR_TEXT).write_text(graph_text(graph))
    return summary(graph)


def _source_map(program: Path) -> dict[str, str]:
    # Note: source lines only make error messages better; they are read from beside the
    # program and never join lower's key, so a comment edit above a layer reruns nothing.
    path = program.with_name("source_map.json")
    return dict(json.loads(path.read_text())) if path.exists() else {}


def all_nodes(graph: Graph) -> list[Node]:
    nodes = list(graph.nodes)
    for _, sub in graph.subgraphs():
        nodes += all_nodes(sub)
    return nodes


def summary(graph: Graph) -> dict[str, Any]:
    nodes = all_nodes(graph)
    fallbacks = sorted({n.target for n in nodes if isinstance(n, Fallback)})
    externs = sum(isinstance(n, Extern) for n in nodes)
    note = f"{len(nodes)} nodes, {externs} extern"
    if fallbacks:
        note += f"; not compiled: {', '.join(f.split('.')[1] for f in fallbacks)}"
    return {"nodes": len(nodes), "externs": externs, "fallbacks": fallbacks, "summary": note}
