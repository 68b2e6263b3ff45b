"""Reading trace's program.json (torch.export's serialized graph) without torch's deserializer.

Note: torch's deserializer imports torch._dynamo (about a second, and several on a machine
with a CUDA build and Triton) and rebuilds FX graphs and fake tensors we do not need: lower
reads the nodes, their named arguments and the shapes in `tensor_values` directly.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch._export.serde.schema import Layout, MemoryFormat, ScalarType

from tasks.ir.dtypes import DType
from tasks.ir.nodes import Buffer, BufferKind
from tasks.lower.context import LoweringError, OutMeta

Json = dict[str, Any]

SCALAR_TYPES = {
    ScalarType.BOOL: DType.BOOL, ScalarType.BYTE: DType.U8, ScalarType.CHAR: DType.I8,
    ScalarType.SHORT: DType.I16, ScalarType.INT: DType.I32, ScalarType.LONG: DType.I64,
    ScalarType.HALF: DType.F16, ScalarType.BFLOAT16: DType.BF16, ScalarType.FLOAT: DType.F32,
    ScalarType.DOUBLE: DType.F64, ScalarType.COMPLEXFLOAT: DType.C64, ScalarType.COMPLEXDOUBLE: DType.C128,
}
_FLOAT_WORDS = {"Infinity": math.inf, "-Infinity": -math.inf, "NaN": math.nan}


def scalar_type(code: int) -> DType:
    if code not in SCALAR_TYPES:
        raise LoweringError(f"dtype {ScalarType(code).name.lower()} is not supported by kiln's IR")
    return SCALAR_TYPES[ScalarType(code)]


@dataclass(frozen=True)
class OperatorRef:
    """An operator passed as an argument (with_effects' op): "aten._linalg_check_errors.default"."""

    name: str


@dataclass(frozen=True)
class TorchEnum:
    """A dtype, layout or memory format argument, kept for the aten fallback."""

    kind: str  # "dtype", "layout", "memory_format"
    name: str  # as torch spells the attribute: "float32", "strided", "contiguous_format"


_LAYOUTS = {Layout.Strided: "strided"}
_FORMATS = {MemoryFormat.ContiguousFormat: "contiguous_format", MemoryFormat.ChannelsLast: "channels_last",
            MemoryFormat.ChannelsLast3d: "channels_last_3d", MemoryFormat.PreserveFormat: "preserve_format"}


def static_size(value: Json, what: str) -> int:
    if "as_int" in value:
        return int(value["as_int"])
    expr = str(value.get("as_expr", {}).get("expr_str", value))
    if "Symbol('u" in expr:  # an unbacked size: torch knows it only once the op has run
        raise LoweringError(f"{what}'s size depends on the values of the data (nonzero, masked_select, "
                            "unique, ...); kiln compiles static shapes only",
                            "compute a fixed-size result instead (a mask, torch.where), or run this part "
                            "outside the compiled model")
    raise LoweringError(f"{what} has a dynamic size ({expr}); kiln compiles static shapes only",
                        "export with concrete example inputs")


def tensor_meta(values: Json, name: str) -> tuple[OutMeta, tuple[int, ...], str]:
    """(shape and dtype, strides, device type) of a named tensor of the graph."""
    value = values.get(name)
    if value is None:
        raise LoweringError(f"the program has no shape for tensor {name!r}")
    what = f"tensor {name!r}"
    shape = tuple(static_size(s, what) for s in value["sizes"])
    strides = tuple(static_size(s, what) for s in value["strides"])
    return OutMeta(shape, scalar_type(value["dtype"]), strides), strides, value["device"]["type"]


def input_buffer(values: Json, name: str, kind: BufferKind, weight: str = "") -> Buffer:
    meta, strides, device = tensor_meta(values, name)
    return Buffer(name, meta.shape, strides, meta.dtype, device, kind, weight)


def decode(arg: Json, tensor: Callable[[str], Any]) -> Any:
    """One serialized argument as a Python value; `tensor(name)` gives a tensor's value."""
    kind, value = next(iter(arg.items()))
    if kind == "as_tensor":
        return tensor(value["name"])
    if kind == "as_tensors":
        return [tensor(v["name"]) for v in value]
    if kind == "as_optional_tensors":
        return [None if "as_none" in v else tensor(v["as_tensor"]["name"]) for v in value]
    if kind == "as_optional_tensor":
        return None if "as_none" in value else tensor(value["as_tensor"]["name"])
    if kind in ("as_none",):
        return None
    if kind in ("as_int", "as_bool", "as_string", "as_ints", "as_bools", "as_strings"):
        return value
    if kind == "as_float":
        return _float(value)
    if kind == "as_floats":
        return [_float(v) for v in value]
    if kind in ("as_sym_int", "as_sym_float", "as_sym_bool"):
        return _static(value, kind)
    if kind in ("as_sym_ints", "as_sym_floats", "as_sym_bools"):
        return [_static(v, kind) for v in value]
    return _enum_or_graph(kind, value)


def _enum_or_graph(kind: str, value: Any) -> Any:
    if kind == "as_scalar_type":
        return TorchEnum("dtype", _torch_dtype_name(value))
    if kind == "as_layout":
        return TorchEnum("layout", _LAYOUTS.get(Layout(value), "strided"))
    if kind == "as_memory_format":
        return TorchEnum("memory_format", _FORMATS.get(MemoryFormat(value), "contiguous_format"))
    if kind == "as_device":
        return TorchEnum("device", str(value["type"]))
    if kind == "as_graph":
        return value  # {"graph": ..., "name": ...}: a subgraph of a higher-order op
    if kind == "as_operator":
        return OperatorRef(str(value).removeprefix("torch.ops."))
    raise LoweringError(f"an argument of kind {kind!r} is not supported")


def _torch_dtype_name(code: int) -> str:
    from tasks.ir.dtypes import TORCH_NAMES

    return TORCH_NAMES[scalar_type(code)]


def _float(value: Any) -> float:
    return _FLOAT_WORDS[value] if isinstance(value, str) else float(value)


def _static(value: Json, kind: str) -> Any:
    for key in ("as_int", "as_float", "as_bool"):
        if key in value:
            return _float(value[key]) if key == "as_float" else value[key]
    raise LoweringError(f"a symbolic value ({kind} {value}) is not supported: kiln compiles static graphs")


def output_names(node: Json) -> list[str | list[str] | None]:
    """The names a node's results are bound to: one per output, a list for a Tensor[] output."""
    names: list[str | list[str] | None] = []
    for out in node["outputs"]:
        kind, value = next(iter(out.items()))
        if kind == "as_tensor":
            names.append(value["name"])
        elif kind == "as_tensors":
            names.append([v["name"] for v in value])
        else:
            names.append(None)
    return names


Meta = OutMeta | tuple[OutMeta | None, ...] | None


def output_meta(values: Json, names: list[str | list[str] | None]) -> Meta:
    metas: list[OutMeta | None] = []
    for name in names:
        if isinstance(name, list):
            metas += [tensor_meta(values, n)[0] for n in name]
        else:
            metas.append(None if name is None else tensor_meta(values, name)[0])
    if len(names) == 1 and not isinstance(names[0], list):
        return metas[0]
    return tuple(metas)
