"""What reads each value of a serialized graph, for the few lowerings whose best form depends on
it (an addmm's bias: tasks/lower/externs.py)."""

from __future__ import annotations

from typing import Any

from tasks.lower import serialized as ser
from tasks.lower.context import Lower

Json = Any
OUTPUT = "output"  # the consumer of a value the graph returns

# Ops that only re-index their input (lowered to views, tasks/lower/views.py): a value read
# through one is read by whatever reads the view.
VIEWS = frozenset({
    "aten.view.default", "aten._unsafe_view.default", "aten.reshape.default", "aten.alias.default",
    "aten.permute.default", "aten.transpose.int", "aten.t.default", "aten.expand.default",
    "aten.unsqueeze.default", "aten.squeeze.dim", "aten.squeeze.dims", "aten.squeeze.default",
    "aten.slice.Tensor", "aten.select.int", "aten.narrow.default", "aten.numpy_T.default",
    # each of its outputs a slice (gpt2's fused query, key and value projection, split in three)
    "aten.split.Tensor", "aten.split_with_sizes.default", "aten.unbind.int", "aten.chunk.default",
    "aten.view_copy.default", "aten.permute_copy.default", "aten.expand_copy.default",
    "aten.unsqueeze_copy.default", "aten.squeeze_copy.dims", "aten.slice_copy.Tensor",
    "aten.select_copy.int", "aten.alias_copy.default", "aten.split_copy.Tensor",
    "aten.split_with_sizes_copy.default", "aten.unbind_copy.int",
})
# Ops kiln runs as library calls (tasks/lower/externs.py): nothing is fused into them.
EXTERNS = frozenset({
    "aten.mm.default", "aten.bmm.default", "aten.addmm.default", "aten.baddbmm.default",
    "aten.convolution.default", "aten.scaled_dot_product_attention.default",
})


def consumers_of(graph: Json) -> dict[str, list[tuple[str, list[str]]]]:
    """Per tensor name: each (op, its output names) that reads it, and ("output", []) where the
    graph returns it."""
    found: dict[str, list[tuple[str, list[str]]]] = {}
    for node in graph["nodes"]:
        target = str(node["target"]).removeprefix("torch.ops.")
        outs = [n for out in ser.output_names(node) for n in (out if isinstance(out, list) else [out]) if n]
        for name in dict.fromkeys(_tensor_names(node["inputs"])):
            found.setdefault(name, []).append((target, outs))
    for name in _tensor_names(graph["outputs"]):
        found.setdefault(name, []).append((OUTPUT, []))
    return found


def only_externs_read(ctx: Lower, name: str) -> bool:
    """Whether every reader of value `name`, through views, is an extern call or the graph's
    output: no kernel of kiln's reads it, so nothing could be fused with the op that makes it.
    Unknown where the graph was not analysed (False)."""
    seen, todo = set(), [name]
    readers = 0
    while todo:
        value = todo.pop()
        if value in seen:
            continue
        seen.add(value)
        for target, outs in ctx.consumers.get(value, []):
            readers += 1
            if target in VIEWS:
                todo.extend(outs)
            elif target not in EXTERNS and target != OUTPUT:
                return False
    return readers > 0


def _tensor_names(arg: Json) -> list[str]:
    """Every tensor name in a serialized argument (or list of them), at any depth."""
    if isinstance(arg, list):
        return [n for item in arg for n in _tensor_names(item)]
    if not isinstance(arg, dict):
        return []
    if isinstance(arg.get("as_tensor"), dict) and "name" in arg["as_tensor"]:
        return [str(arg["as_tensor"]["name"])]
    if isinstance(arg.get("as_tensors"), list):  # a Tensor[]: its items are {"name": ...}
        return [str(item["name"]) for item in arg["as_tensors"] if isinstance(item, dict) and "name" in item]
    return [n for value in arg.values() for n in _tensor_names(value)]
