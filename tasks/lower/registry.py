"""The lowering table: one small function per aten op, registered beside its helpers.

`LOWERINGS` maps "aten.add.Tensor" to its function. An op with no entry is called as it is
through the aten fallback: correct, counted, and reported as not compiled.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from cache.hashing import canonical_json
from tasks.ir.dtypes import TORCH_NAMES
from tasks.ir.nodes import Fallback, View
from tasks.lower.context import Call, Lower, LoweringError, OutMeta
from tasks.lower.serialized import TorchEnum
from tasks.lower.values import TensorValue

Lowering = Callable[[Lower, Call], Any]
LOWERINGS: dict[str, Lowering] = {}


def register(*targets: str) -> Callable[[Lowering], Lowering]:
    def add(fn: Lowering) -> Lowering:
        for target in targets:
            if target in LOWERINGS:
                raise ValueError(f"two lowerings for {target}")
            LOWERINGS[target] = fn
        return fn

    return add


def lower_fallback(ctx: Lower, call: Call) -> Any:  # TensorValue or a tuple of them
    """Call the aten op as it is. Its tensors cross as strided views; outputs are fresh buffers."""
    namespace = call.target.split(".")[0]
    if namespace not in ("aten", "prims") or not _resolvable(call.target):
        raise LoweringError(f"{call.target} has no lowering and no aten fallback (is the library "
                            "that defines it loaded?)")
    views: list[View] = []
    args = {k: _encode(v, ctx, call, views) for k, v in call.args.items()}
    metas = call.out if isinstance(call.out, tuple) else (call.out,)
    if any(m is None for m in metas):
        raise LoweringError(f"{call.target} returns a value that is not a tensor; kiln cannot call it")
    outs = tuple(ctx.new_buffer(m.shape, m.dtype) for m in metas if isinstance(m, OutMeta))
    spec = {"args": [], "kwargs": args}
    ctx.emit(Fallback(call.target, outs, tuple(views), canonical_json(spec).decode(), call.origin))
    values = tuple(TensorValue.of(b) for b in outs)
    return values if isinstance(call.out, tuple) else values[0]


def _encode_enum(value: TorchEnum) -> Any:
    if value.kind == "dtype":
        return {"dtype": next(k.value for k, v in TORCH_NAMES.items() if v == value.name)}
    if value.kind == "device":
        return {"device": value.name}
    return {"enum": f"torch.{value.name}"}


def _resolvable(target: str) -> bool:
    try:
        namespace, name, overload = target.split(".")
        getattr(getattr(getattr(torch.ops, namespace), name), overload)
    except (AttributeError, ValueError):
        return False
    return True


def _encode(value: Any, ctx: Lower, call: Call, views: list[View]) -> Any:
    if isinstance(value, TensorValue):
        views.append(ctx.view(value, call.origin))
        return {"input": len(views) - 1}
    if isinstance(value, list | tuple):
        return [_encode(v, ctx, call, views) for v in value]
    if isinstance(value, float):
        return {"float": value.hex()}
    if isinstance(value, TorchEnum):
        return _encode_enum(value)
    if isinstance(value, torch.dtype):
        name = str(value).removeprefix("torch.")
        return {"dtype": next(k.value for k, v in TORCH_NAMES.items() if v == name)}
    if isinstance(value, torch.device):
        return {"device": value.type}
    if isinstance(value, torch.layout | torch.memory_format):
        return {"enum": str(value)}
    if value is None or isinstance(value, bool | int | str):
        return value
    raise LoweringError(f"{call.target}: cannot pass argument {value!r} to the aten fallback")
