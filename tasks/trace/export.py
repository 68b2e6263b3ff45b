"""torch.export with the decompositions later stages want, and a deterministic program file.

Note: torch.export.save is not deterministic here: its zip holds a random serialization id,
node metadata carries `from_node` records with Python object ids, and stack traces carry line
numbers, so a comment edit would change every downstream key. We write the serialized graph
as canonical JSON instead, with node metadata cut to a fixed allow-list; stack traces move to
source_map.json, which no later stage's key includes. Weights go to their own file: the
program holds none, so a new checkpoint leaves it byte-identical and everything below cut off.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch._export.serde.serialize import serialize

from cache.hashing import canonical_json
from contract.errors import KilnError
from contract.return_types import portable_spec
from tasks.trace.factory import is_model_file, shown_path, user_frame

# Ops that stay whole: later stages lower them to extern kernels, not to their decomposition.
KEEP_OPS = ("scaled_dot_product_attention.default",)
_META_KEEP = ("nn_module_stack", "source_fn_stack", "torch_fn")
_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<fn>\S+)\n\s*(?P<code>.*)')
_REASON_LINES = 8


def export_program(
    module: torch.nn.Module, args: tuple[Any, ...], model: str, root: Path
) -> torch.export.ExportedProgram:
    """torch.export, then the decompositions later stages want."""
    return decompose(export_only(module, args, model, root), model, root)


def export_only(
    module: torch.nn.Module, args: tuple[Any, ...], model: str, root: Path,
    warn: Callable[[str], None] = lambda _text: None,
) -> torch.export.ExportedProgram:
    """torch.export as it is: its weights are final, its graph not yet decomposed."""
    if _mode_matters(module):
        warn(f"model {model!r} is in training mode and is compiled so, as eager runs it: batch norm "
             "takes the batch's statistics and updates its running stats. Call model.eval() first "
             "to compile inference")
    with _export_errors(model, root):
        with _without_kv_cache(module, _generates(module)) as turned_off:
            try:
                program = torch.export.export(module, args, strict=False)
            except Exception as err:
                if turned_off or not _CACHE_OUT.search(str(err)):
                    raise
                program = None  # a cache nobody asked for: a decoder's base model, or a wrapper's
        if program is None:
            with _without_kv_cache(module, True) as turned_off:
                program = torch.export.export(module, args, strict=False)
        if turned_off:
            warn(f"model {model!r}: use_cache turned off for the compile: the compiled forward returns "
                 "no past_key_values (kiln compiles one forward pass, not a generation loop with a KV "
                 "cache)")
        return program


def _mode_matters(module: torch.nn.Module) -> bool:
    """In training mode, with a submodule whose forward depends on it (batch norm, dropout)."""
    kinds = (torch.nn.modules.batchnorm._NormBase, torch.nn.modules.dropout._DropoutNd)
    return module.training and any(isinstance(m, kinds) for m in module.modules())


# Note: export's error where a forward returns a Cache object (DynamicCache, EncoderDecoderCache)
_CACHE_OUT = re.compile(r"Found (<class ')?[\w.]*Cache('>)? in output")


def _generates(module: torch.nn.Module) -> bool:
    """A transformers model that returns its KV cache by default: one that generates, or whose
    config says it decodes. Others (a decoder's base model, a classification head, a module
    wrapping a model) are found by export's error instead (export_only)."""
    top = getattr(module, "config", None)
    generates = getattr(module, "can_generate", None)
    return bool((callable(generates) and generates()) or getattr(top, "is_decoder", False)
                or getattr(top, "is_encoder_decoder", False))


@contextlib.contextmanager
def _without_kv_cache(module: torch.nn.Module, decoder: bool) -> Iterator[bool]:
    """A transformers model whose config turns its KV cache on, with it off for the export.

    Note: with use_cache on (transformers' default), a decoder returns its cache as a Cache
    object that torch's pytree does not know, and export fails. The caller gave no
    past_key_values and asked for no cache (kiln's compile takes the inputs alone), so the
    program is exported as the same forward without one, and the user is told once. Every
    submodule's config is turned off: an encoder-decoder's stacks hold copies of it (T5), and
    a user's module may wrap the model."""
    configs: dict[int, Any] = {}
    for submodule in module.modules() if decoder else ():  # an encoder (BERT) returns no cache
        config = getattr(submodule, "config", None)
        if getattr(config, "use_cache", None) is True:
            configs[id(config)] = config
    for config in configs.values():
        config.use_cache = False
    try:
        yield bool(configs)
    finally:
        for config in configs.values():
            config.use_cache = True


def decompose(program: torch.export.ExportedProgram, model: str, root: Path) -> torch.export.ExportedProgram:
    with _export_errors(model, root):
        decomposed: torch.export.ExportedProgram = program.run_decompositions(decomposition_table())
    check_control_flow(decomposed, model, root)
    return decomposed


@contextlib.contextmanager
def _export_errors(model: str, root: Path) -> Iterator[None]:
    """torch's errors as a KilnError naming the model and the user's line."""
    try:
        yield
    except KilnError:
        raise
    except Exception as err:
        reason = "\n    ".join(str(err).strip().splitlines()[:_REASON_LINES])
        data_dependent = "DataDependent" in type(err).__name__
        raise KilnError(
            f"model {model!r}: torch.export failed: {type(err).__name__}: {reason}"
            f"{user_frame(err, root)}",
            _DATA_DEPENDENT_HINT if data_dependent else
            "make the model exportable (see torch.export's docs on the construct named above)",
        ) from err


# Note: transformers' BART, in float16, checks its hidden states for inf in Python after every
# encoder layer (`if ... not torch.isfinite(h).all(): clamp`): export cannot trace it, so the
# hint names both ways out.
_DATA_DEPENDENT_HINT = ("the line above branches in Python on a tensor's value, which export traces "
                        "one way only: rewrite it with torch.cond or torch.where; a branch only one "
                        "dtype takes (a float16 overflow check) is not taken in bfloat16 or float32")


def decomposition_table() -> dict[Any, Any]:
    table = dict(torch.export.default_decompositions())
    for name in KEEP_OPS:
        packet, overload = name.split(".")
        table.pop(getattr(getattr(torch.ops.aten, packet), overload), None)
    return table


def source_map(program: torch.export.ExportedProgram, root: Path) -> dict[str, str]:
    """node name -> 'file:line: code' of the innermost model frame that produced it."""
    found = {node.name: node_source(node, root) for node in program.graph.nodes}
    return {name: where for name, where in found.items() if where}


def node_source(node: torch.fx.Node, root: Path) -> str:
    """'file:line: code' of the innermost model frame that produced node, or ''."""
    trace = node.meta.get("stack_trace")
    frames = [m for m in _FRAME.finditer(trace or "") if is_model_file(m["file"], root)]
    if not frames:
        return ""
    last = frames[-1]
    return f"{shown_path(last['file'], root)}:{last['line']}: {last['code'].strip()}"


def check_control_flow(program: torch.export.ExportedProgram, model: str, root: Path) -> None:
    """A clear error for a while_loop that carries a value that is not a tensor (a Python or
    symbolic int): kiln's loops carry tensors only, and torch cannot serialize such a loop."""
    for module in program.graph_module.modules():
        if not isinstance(module, torch.fx.GraphModule):
            continue
        for node in module.graph.find_nodes(op="call_function", target=torch.ops.higher_order.while_loop):
            for i, value in enumerate(node.args[2]):
                val = value.meta.get("val") if isinstance(value, torch.fx.Node) else value
                if not isinstance(val, torch.Tensor):
                    where = node_source(node, root)
                    at = f" at {where}" if where else ""
                    raise KilnError(
                        f"model {model!r}: torch.while_loop carries a {type(val).__name__} "
                        f"(carried value {i}){at}; kiln's while_loop carries tensors only",
                        "carry a tensor instead: torch.tensor(0) for a counter, say")


def program_json(program: torch.export.ExportedProgram) -> bytes:
    # Note: only the graph's JSON is kept (the weights go to safetensors), so where torch can
    # skip them the weights are not pickled too: that was ~1.2 s of bert's trace. An older torch
    # without the switches pickles them anyway.
    skip: dict[str, Any] = {"serialize_state_dict": False, "serialize_constants": False,
                            "serialize_example_inputs": False}
    known = inspect.signature(serialize).parameters
    with _portable_out_specs(program):
        artifact = serialize(program, **{k: v for k, v in skip.items() if k in known})
    data = json.loads(artifact.exported_program)
    _strip_metadata(data["graph_module"])
    return canonical_json(data)


@contextlib.contextmanager
def _portable_out_specs(program: torch.export.ExportedProgram) -> Iterator[None]:
    """The program's output specs with torch.return_types results as namedtuples while it is
    serialized (contract/return_types.py says why)."""
    signatures = [entry.signature for entry in program.module_call_graph if entry.signature is not None]
    before = [signature.out_spec for signature in signatures]
    for signature in signatures:
        signature.out_spec = portable_spec(signature.out_spec)
    try:
        yield
    finally:
        for signature, spec in zip(signatures, before, strict=True):
            signature.out_spec = spec


def _strip_metadata(graph_module: dict[str, Any]) -> None:
    for node in graph_module["graph"]["nodes"]:
        meta = node.get("metadata", {})
        node["metadata"] = {k: v for k, v in meta.items() if k in _META_KEEP}
        for arg in node.get("inputs", []):
            sub = arg.get("arg", {}).get("as_graph")
            if sub:
                _strip_metadata(sub)
    for sub in graph_module.get("subgraphs", []) or []:
        _strip_metadata(sub)


def weight_tensors(program: torch.export.ExportedProgram) -> dict[str, torch.Tensor]:
    """Parameters, buffers and lifted tensor constants, by their fully qualified names."""
    tensors = {name: t for name, t in program.state_dict.items() if isinstance(t, torch.Tensor)}
    for name, value in program.constants.items():
        if not isinstance(value, torch.Tensor):
            raise KilnError(f"constant {name!r} is a {type(value).__name__}; kiln supports "
                            "only tensor constants")
        tensors[name] = value
    return tensors
