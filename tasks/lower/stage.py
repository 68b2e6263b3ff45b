"""The lower stage's entry: program.json -> ir.json (canonical) and ir.txt (readable)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cache.hashing import canonical_json
from contract.config import LAYOUT_DEFAULT
from contract.errors import KilnError
from contract.job import StageJob
from tasks.ir import serialize
from tasks.ir.nodes import Extern, Fallback, Graph, Node
from tasks.ir.text import graph_text
from tasks.lower.context import LoweringError
from tasks.lower.program import lower_program

IR = "ir.json"
IR_TEXT = "ir.txt"
SIGNATURE = "signature.json"  # the model's input and output structure, for the loader
PROGRAM = "trace/program.json"


def preload(target: str) -> None:
    """What a warm worker imports ahead (pipeline/warm.py): torch's type promotion, which the
    lowering asks on its first pointwise op, imports sympy, 0.6 s of bert's lower."""
    import torch._prims_common  # noqa: F401


def run(job: StageJob) -> Mapping[str, Any]:
    program_path = job.input(PROGRAM)
    source_map = _source_map(program_path)
    program = json.loads(program_path.read_text())
    try:
        check_targets(program, source_map)
        graph = lower_program(program, source_map, layout_of(job))
    except LoweringError as err:
        raise KilnError(f"model {job.model!r}: {err}", err.hint) from None
    out = job.out_dir
    (out / IR).write_bytes(serialize.dumps(graph))
    (out / IR_TEXT).write_text(graph_text(graph))
    (out / SIGNATURE).write_bytes(canonical_json(signature(program)))
    return summary(graph)


def layout_of(job: StageJob) -> str:
    """The config's lower.layout on the cuda target; on the cpu target, the traced layouts."""
    return str(job.config.get("lower.layout") or LAYOUT_DEFAULT) if job.target == "cuda" else "traced"


def signature(program: Any) -> dict[str, Any]:
    """The pytree specs of the model's inputs and outputs, as torch.export serialized them."""
    calls = program["graph_module"].get("module_call_graph") or [{}]
    sig = calls[0].get("signature") or {}
    return {"in_spec": sig.get("in_spec"), "out_spec": sig.get("out_spec")}


def check_targets(data: Any, source_map: Mapping[str, str]) -> None:
    """Every op the program calls must resolve: an op from a library that is not loaded cannot
    be lowered or called, and torch's deserializer would only say so in a long trace."""
    import torch

    for node in _program_nodes(data):
        target = str(node.get("target", ""))
        if not target.startswith("torch.ops."):
            continue
        try:
            found: Any = torch.ops
            for part in target.removeprefix("torch.ops.").split("."):
                found = getattr(found, part)
        except (AttributeError, RuntimeError):
            line = source_map.get(node.get("name", ""), "")
            where = f"\n  at {line}" if line else ""
            raise LoweringError(f"{target.removeprefix('torch.ops.')} has no lowering and no aten fallback: "
                                f"the library that defines it is not loaded{where}",
                                "write the op with aten ops, or register a lowering for it in tasks/lower/"
                                ) from None


def _program_nodes(value: Any) -> list[dict[str, Any]]:
    """Every node of the serialized program, subgraphs included."""
    found: list[dict[str, Any]] = []
    if isinstance(value, dict):
        if "target" in value and "inputs" in value:
            found.append(value)
        for item in value.values():
            found += _program_nodes(item)
    elif isinstance(value, list):
        for item in value:
            found += _program_nodes(item)
    return found


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


def fallback_counts(nodes: list[Node]) -> dict[str, int]:
    """How many calls of each aten op kiln leaves to torch (Fallback nodes), by op name."""
    counts = Counter(n.target for n in nodes if isinstance(n, Fallback))
    return dict(sorted(counts.items()))


def summary(graph: Graph) -> dict[str, Any]:
    nodes = all_nodes(graph)
    fallbacks = fallback_counts(nodes)
    externs = sum(isinstance(n, Extern) for n in nodes)
    note = f"{len(nodes)} nodes, {externs} extern"
    if fallbacks:
        calls = (op.split(".")[1] + (f" x{n}" if n > 1 else "") for op, n in fallbacks.items())
        note += f"; not compiled: {', '.join(calls)}"
    return {"nodes": len(nodes), "externs": externs, "fallbacks": fallbacks, "summary": note}
