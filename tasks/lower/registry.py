"""The lowering table: one small function per aten op, registered beside its helpers.

`LOWERINGS` maps "aten.add.Tensor" to its function. An op with no entry is called as it is
through the aten fallback: correct, counted, and reported as not compiled.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from cache.hashing import canonical_json
from tasks.ir.dtypes import TORCH_NAMES, DType
from tasks.ir.expr import const
from tasks.ir.nodes import Fallback, View
from tasks.lower.context import Call, Lower, LoweringError, OutMeta
from tasks.lower.serialized import TorchEnum
from tasks.lower.values import TensorValue

Lowering = Callable[[Lower, Call], Any]
LOWERINGS: dict[str, Lowering] = {}


class _Token:
    """The value of an effect token: torch threads one through effectful ops to order them."""

    def __repr__(self) -> str:
        return "TOKEN"


TOKEN = _Token()


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
    if namespace not in ("aten", "prims"):
        # Note: a custom op (a library's torch.library op, as transformers' MoE experts) may be
        # loaded here, but the compiled model runs without Python: only aten and prims ops have
        # C++ kernels its runtime can call.
        raise LoweringError(f"{call.target} is a custom op of the {namespace!r} library: kiln has no "
                            "lowering for it, and the compiled model can call only aten and prims ops",
                            "write it with aten ops, or choose the library's plain-torch path for it")
    if not _resolvable(call.target):
        raise LoweringError(f"{call.target} has no lowering and no aten fallback (is the library "
                            "that defines it loaded?)")
    returns_nothing = not _op(call.target)._schema.returns
    metas = () if returns_nothing else call.out if isinstance(call.out, tuple) else (call.out,)
    if any(m is None for m in metas):
        raise LoweringError(f"{call.target} returns a value that is not a tensor; kiln cannot call it")
    target, bound = _without_scalars(ctx, call)
    bound = _numbers_as_tensors(ctx, call, target, bound)
    views: list[View] = []
    args = {k: _encode(v, ctx, call, views) for k, v in bound.items()}
    outs = tuple(ctx.new_buffer(m.shape, m.dtype) for m in metas if isinstance(m, OutMeta))
    spec = {"args": [], "kwargs": args}
    ctx.emit(Fallback(target, outs, tuple(views), canonical_json(spec).decode(), call.origin))
    if returns_nothing:  # a check (torch's _linalg_check_errors): run for its error, kept by the schedule
        return None
    values = tuple(TensorValue.of(b) for b in outs)
    return values if isinstance(call.out, tuple) else values[0]


def _without_scalars(ctx: Lower, call: Call) -> tuple[str, dict[str, Any]]:
    """The call with its Scalar arguments as 0-d tensors, through the op's overload that takes
    tensors in their places (pow.Tensor_Scalar -> pow.Tensor_Tensor, lerp.Scalar -> lerp.Tensor,
    a polynomial's n_scalar -> default); the call as it is if it passes no Scalar or the op has
    no such overload (the C++ generator then calls it through kiln's boxed call, kiln_boxed.h).

    Note: torch's stable dispatcher, which a fallback calls, converts no Scalar (2.11 to 2.13),
    and kiln's boxed call is built against ATen (seconds, once per machine), so an overload
    taking tensors is preferred where there is one.
    Each 0-d tensor takes the dtype of the call's first tensor where that holds the value
    (_zero_dim), so type promotion gives what the Scalar gave."""
    packet_name = call.target.rsplit(".", 1)[0]
    schema = _op(call.target)._schema
    scalars = {a.name for a in schema.arguments
               if _is_number(a.type) and isinstance(call.args.get(a.name), bool | int | float)}
    if not scalars:
        return call.target, call.args
    # an optional Scalar left None may be an optional Tensor there (clamp's min or max)
    unset = {a.name for a in schema.arguments if _is_number(a.type) and call.args.get(a.name) is None}
    namespace, name = packet_name.split(".")
    packet = getattr(getattr(torch.ops, namespace), name)
    for overload in packet.overloads():
        other = getattr(packet, overload)._schema
        if _takes_tensors_for(schema, other, scalars, unset):
            bound = {k: _zero_dim(ctx, call, v) if k in scalars else v for k, v in call.args.items()}
            return f"{packet_name}.{overload}", bound
    return call.target, call.args


def _numbers_as_tensors(ctx: Lower, call: Call, target: str, bound: dict[str, Any]) -> dict[str, Any]:
    """A number where the schema takes a Tensor (export passes `f * 2` as mul.Tensor(f, 2)), as
    a 0-d tensor: the dispatcher takes only tensors there."""
    tensors = {a.name for a in _op(target)._schema.arguments if a.type.kind() == "TensorType"}
    return {k: _zero_dim(ctx, call, v) if k in tensors and isinstance(v, bool | int | float) else v
            for k, v in bound.items()}


def _op(target: str) -> Any:
    namespace, name, overload = target.split(".")
    return getattr(getattr(getattr(torch.ops, namespace), name), overload)


def _is_number(jit_type: Any) -> bool:
    if jit_type.kind() == "OptionalType":
        jit_type = jit_type.getElementType()
    return bool(jit_type.kind() == "NumberType")


def _takes_tensors_for(schema: Any, other: Any, names: set[str], unset: set[str]) -> bool:
    """Whether `other` has schema's arguments and returns, with Tensors for `names` (and for
    `unset`, optionally)."""
    if [a.name for a in schema.arguments] != [a.name for a in other.arguments] or \
            [str(r.type) for r in schema.returns] != [str(r.type) for r in other.returns]:
        return False
    for mine, theirs in zip(schema.arguments, other.arguments, strict=True):
        wanted = ("Tensor", "Tensor?") if mine.name in names else \
            (str(mine.type), "Tensor?") if mine.name in unset else (str(mine.type),)
        if str(theirs.type) not in wanted or (theirs.alias_info is not None and theirs.alias_info.is_write):
            return False
    return True


def _zero_dim(ctx: Lower, call: Call, value: bool | int | float) -> TensorValue:
    """A Scalar as a 0-d tensor of the call's first tensor's dtype where that holds the value
    exactly (a Python number does not widen a tensor's dtype; a 0-d tensor of the same dtype
    does not either, with dims or without), else of the dtype torch gives such a number."""
    first = next((v.dtype for v in call.args.values() if isinstance(v, TensorValue)), None)
    if first is not None and _holds(first, value):
        dtype = first
    else:
        dtype = DType.BOOL if isinstance(value, bool) else DType.I64 if isinstance(value, int) else DType.F32
    return ctx.pointwise((), dtype, call.origin, lambda loop: const(value, dtype))


# Integers a float dtype holds exactly: below 2**(mantissa bits + 1).
_EXACT_INTS = {DType.F64: 2**53, DType.F32: 2**24, DType.F16: 2**11, DType.BF16: 2**8}


def _holds(dtype: DType, value: bool | int | float) -> bool:
    if dtype.is_complex:  # kiln computes no complex value; the number's own dtype promotes the same
        return False
    if isinstance(value, bool) or dtype is DType.BOOL:
        return isinstance(value, bool) or dtype is not DType.BOOL
    if dtype.is_float:
        return isinstance(value, float) or abs(value) <= _EXACT_INTS.get(dtype, 0)
    if isinstance(value, float):
        return False
    info = torch.iinfo(getattr(torch, TORCH_NAMES[dtype]))
    return info.min <= value <= info.max


def _encode_enum(value: TorchEnum) -> Any:
    if value.kind == "dtype":
        return {"dtype": next(k.value for k, v in TORCH_NAMES.items() if v == value.name)}
    if value.kind == "device":
        return {"device": value.name}
    return {"enum": f"torch.{value.name}"}


def _resolvable(target: str) -> bool:
    try:
        _op(target)
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
