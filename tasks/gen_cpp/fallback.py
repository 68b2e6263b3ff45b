"""An aten fallback as C++: the op's arguments pushed in schema order onto a kiln::FallbackCall
(runtime/kiln_fallback.h), the dispatcher called, each returned tensor copied into its output.

    {
      kiln::FallbackCall fb("aten::cumsum", "", "aten.cumsum.default");
      fb.push_tensor(in0);  // self
      fb.push_int(1);  // dim
      fb.push_dtype(aoti_torch_dtype_float64());  // dtype
      fb.wrap_optional();
      fb.run({kiln::Ret::kTensor});
      fb.copy_tensor(0, out0);
    }

Note: a Fallback's args JSON sorts its keyword names, so the order comes from torch's schema,
read here at generation time; the dispatcher converts each StableIValue by the same schema's
types, so the C++ depends on nothing else.

Note: Scalar (NumberType) arguments have no StableIValue conversion in torch (2.11 to 2.13).
An op whose schema takes one (histc's min, addmv's beta, where lowering found no overload
taking a 0-d tensor instead) is called through kiln::BoxedCall (runtime/kiln_boxed.h) with the
same pushes: kiln's own boxed call, built against ATen and linked only into models that use it.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from tasks.ir.dtypes import TORCH_NAMES, DType
from tasks.ir.nodes import Fallback

_LAYOUTS = {"torch.strided": "aoti_torch_layout_strided()"}
_MEMORY_FORMATS = {
    f"torch.{name}": f"aoti_torch_memory_format_{name}()"
    for name in ("contiguous_format", "channels_last", "channels_last_3d", "preserve_format")
}
_DEVICES = {"cpu": "aoti_torch_device_type_cpu()", "cuda": "aoti_torch_device_type_cuda()"}
_INT_KINDS = ("IntType", "SymIntType")


class _Unsupported(Exception):
    pass


def fallback_call(node: Fallback, inputs: list[str], outs: list[str]) -> list[str]:
    """C++ lines, one `{ ... }` block, that call node's op on `inputs` into `outs`.

    inputs[i]: an AtenTensorHandle expression for node.inputs[i]; outs[j] one for node.outs[j]
    (preallocated, of the right shape, dtype and strides). Both stay owned by the caller.
    """
    if len(inputs) != len(node.inputs) or len(outs) != len(node.outs):
        raise ValueError(f"{node.target}: {len(inputs)} inputs and {len(outs)} outputs given, "
                         f"the node has {len(node.inputs)} and {len(node.outs)}")
    namespace, name, overload = _split(node.target)
    schema = _schema(node.target)
    boxed = needs_boxed_call(schema)
    call_class = "kiln::BoxedCall" if boxed else "kiln::FallbackCall"
    lines = [f'{call_class} fb("{namespace}::{name}", "{"" if overload == "default" else overload}", '
             f'"{node.target}");']
    for arg, value in _bound(node, schema):
        if arg.alias_info is not None and arg.alias_info.is_write:
            raise ValueError(f"{node.target}: writes its argument {arg.name!r}, and a fallback's inputs "
                             "are kiln's buffers: call the functional op")
        try:
            pushes = _push(arg.real_type, value, inputs, boxed)
        except _Unsupported as e:
            raise ValueError(f"{node.target}: argument {arg.name!r} ({arg.real_type}): {e}") from None
        pushes[0] += f"  // {arg.name}"
        lines += pushes
    lines += _returns(node, schema, outs)
    return ["{", *("  " + line for line in lines), "}"]


def needs_boxed_call(schema: Any) -> bool:
    """Whether an op's schema takes a Scalar, which only kiln's boxed call can pass."""
    def scalar(jit_type: Any) -> bool:
        kind = jit_type.kind()
        if kind in ("OptionalType", "ListType"):
            return scalar(jit_type.getElementType())
        return bool(kind == "NumberType")

    return any(scalar(arg.real_type) for arg in schema.arguments)


def uses_boxed_call(node: Fallback) -> bool:
    return needs_boxed_call(_schema(node.target))


def _split(target: str) -> tuple[str, str, str]:
    parts = target.split(".")
    if len(parts) != 3 or not all(re.fullmatch(r"\w+", p) for p in parts):
        raise ValueError(f"{target!r} is not an op overload name (namespace.op.overload)")
    return parts[0], parts[1], parts[2]


def _schema(target: str) -> Any:
    import torch

    namespace, name, overload = _split(target)
    try:
        op = getattr(getattr(getattr(torch.ops, namespace), name), overload)
    except AttributeError:
        raise ValueError(f"{target}: torch has no such op (is the library that defines it loaded?)") from None
    return op._schema


def _bound(node: Fallback, schema: Any) -> list[tuple[Any, Any]]:
    """(schema argument, JSON value) for every argument, in schema order, defaults filled in."""
    spec = json.loads(node.args)
    positional, kwargs = list(spec["args"]), dict(spec["kwargs"])
    unknown = sorted(set(kwargs) - {a.name for a in schema.arguments})
    if unknown:
        raise ValueError(f"{node.target}: arguments {unknown} are not in torch's schema {schema}")
    bound = []
    for arg in schema.arguments:
        if positional and not arg.kwarg_only:
            bound.append((arg, positional.pop(0)))
        elif arg.name in kwargs:
            bound.append((arg, kwargs[arg.name]))
        elif arg.has_default_value():
            bound.append((arg, _json_default(node.target, arg)))
        else:
            raise ValueError(f"{node.target}: argument {arg.name!r} has no value and no default")
    if positional:
        raise ValueError(f"{node.target}: {len(positional)} positional arguments more than the schema takes")
    return bound


def _json_default(target: str, arg: Any) -> Any:
    """A schema default as the Fallback JSON writes values."""
    def encode(value: Any) -> Any:
        if isinstance(value, float):
            return {"float": value.hex()}
        if isinstance(value, list | tuple):
            return [encode(v) for v in value]
        if value is None or isinstance(value, bool | int | str):
            return value
        raise ValueError(f"{target}: the default {value!r} of argument {arg.name!r} cannot be passed")

    return encode(arg.default_value)


def _push(jit_type: Any, value: Any, inputs: list[str], boxed: bool) -> list[str]:
    """The fb.push_* lines for one value of a schema type (a torch._C JitType)."""
    kind = jit_type.kind()
    if kind == "OptionalType":
        if value is None:
            return ["fb.push_none();"]
        return [*_push(jit_type.getElementType(), value, inputs, boxed), "fb.wrap_optional();"]
    if value is None:
        raise _Unsupported("None for an argument that is not optional")
    if kind == "ListType":
        return _push_list(jit_type.getElementType(), value, inputs, boxed)
    if kind == "TensorType":
        return [f"fb.push_tensor({_input(value, inputs)});"]
    if kind == "NumberType" and boxed:
        return [_push_number(value)]
    return [_push_scalar(kind, value)]


# The element kinds of a list kiln::BoxedCall builds (kiln_boxed.h), by schema element type.
_BOXED_LISTS = {"FloatType": "KILN_LIST_DOUBLE", "BoolType": "KILN_LIST_BOOL",
                "TensorType": "KILN_LIST_TENSOR", "OptionalType": "KILN_LIST_OPTIONAL_TENSOR"}


def _push_list(item_type: Any, value: Any, inputs: list[str], boxed: bool) -> list[str]:
    if not isinstance(value, list):
        raise _Unsupported(f"{value!r} is not a list")
    if item_type.kind() in _INT_KINDS:
        return [f"fb.push_int_list({{{', '.join(_int(v) for v in value)}}});"]
    begin = "fb.begin_list();"
    if boxed:
        kind = item_type.kind()
        if kind not in _BOXED_LISTS or (kind == "OptionalType" and
                                        item_type.getElementType().kind() != "TensorType"):
            raise _Unsupported(f"kiln's boxed call builds no list of {item_type}")
        begin = f"fb.begin_list({_BOXED_LISTS[kind]});"
    lines = [begin]
    for item in value:
        lines += _push(item_type, item, inputs, boxed)
    return [*lines, "fb.end_list();"]


def _push_number(value: Any) -> str:
    """A Scalar for kiln's boxed call: an int, a float or a bool, as the program holds it."""
    if isinstance(value, bool):
        return f"fb.push_scalar_bool({'true' if value else 'false'});"
    if isinstance(value, int):
        return f"fb.push_scalar_int({_int(value)});"
    return f"fb.push_scalar_double({_double(value)});"


def _push_scalar(kind: str, value: Any) -> str:
    if kind in _INT_KINDS:
        return f"fb.push_int({_int(value)});"
    if kind == "FloatType":
        return f"fb.push_double({_double(value)});"
    if kind == "BoolType":
        if not isinstance(value, bool):
            raise _Unsupported(f"{value!r} is not a bool")
        return f"fb.push_bool({'true' if value else 'false'});"
    if kind == "ScalarTypeType":
        return f"fb.push_dtype(aoti_torch_dtype_{TORCH_NAMES[DType(_field(value, 'dtype'))]}());"
    if kind == "LayoutType":
        return f"fb.push_enum({_lookup(_LAYOUTS, _field(value, 'enum'), 'layout')});"
    if kind == "MemoryFormatType":
        return f"fb.push_enum({_lookup(_MEMORY_FORMATS, _field(value, 'enum'), 'memory format')});"
    if kind == "DeviceObjType":
        # Note: kiln keeps a device's type only; index -1 is what torch.device("cuda") holds.
        return f"fb.push_device({_lookup(_DEVICES, _field(value, 'device'), 'device')}, -1);"
    if kind == "StringType":
        if not isinstance(value, str):
            raise _Unsupported(f"{value!r} is not a string")
        return f"fb.push_string({_string_literal(value)});"
    raise _Unsupported(f"no StableIValue encoding for schema type kind {kind}")


def _input(value: Any, inputs: list[str]) -> str:
    index = _field(value, "input")
    if not isinstance(index, int) or not 0 <= index < len(inputs):
        raise _Unsupported(f"tensor input {index!r} out of range")
    return inputs[index]


def _field(value: Any, key: str) -> Any:
    if not isinstance(value, dict) or key not in value:
        raise _Unsupported(f"expected {{{key!r}: ...}}, got {value!r}")
    return value[key]


def _lookup(table: dict[str, str], key: Any, what: str) -> str:
    if key not in table:
        raise _Unsupported(f"{what} {key!r} is not supported")
    return table[key]


def _int(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _Unsupported(f"{value!r} is not an int")
    if not -(2**63) <= value < 2**63:
        raise _Unsupported(f"{value} does not fit in int64")
    # Note: -2**63 has no literal (the minus applies to a positive literal too large for int64).
    return "INT64_MIN" if value == -(2**63) else str(value)


def _double(value: Any) -> str:
    if isinstance(value, dict):
        number = float.fromhex(_field(value, "float"))
    elif isinstance(value, int) and not isinstance(value, bool):
        number = float(value)
    else:
        raise _Unsupported(f"{value!r} is not a float")
    if math.isnan(number):
        return "std::numeric_limits<double>::quiet_NaN()"
    if math.isinf(number):
        return f"{'-' if number < 0 else ''}std::numeric_limits<double>::infinity()"
    return f"{number.hex()} /* {number!r} */"


def _string_literal(text: str) -> str:
    if not all(" " <= c <= "~" for c in text):
        raise _Unsupported(f"string {text!r} has characters other than printable ASCII")
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _returns(node: Fallback, schema: Any, outs: list[str]) -> list[str]:
    """fb.run(...) with the return kinds, then one copy per return into kiln's outputs."""
    kinds = []
    for ret in schema.returns:
        t = ret.real_type
        if t.kind() == "TensorType":
            kinds.append("kTensor")
        elif t.kind() == "ListType" and t.getElementType().kind() == "TensorType":
            kinds.append("kTensorList")
        else:
            raise ValueError(f"{node.target}: returns {t}, which kiln cannot take as a tensor output")
    if kinds.count("kTensorList") > 1:
        raise ValueError(f"{node.target}: more than one Tensor[] return")
    in_list = len(outs) - kinds.count("kTensor")
    if in_list < 0 or (in_list and "kTensorList" not in kinds):
        raise ValueError(f"{node.target}: {len(outs)} outputs for the returns {schema.returns}")
    lines = [f"fb.run({{{', '.join('kiln::Ret::' + k for k in kinds)}}});"]
    taken = 0
    for i, kind in enumerate(kinds):
        if kind == "kTensor":
            lines.append(f"fb.copy_tensor({i}, {outs[taken]});")
            taken += 1
        else:
            lines.append(f"fb.copy_tensor_list({i}, {{{', '.join(outs[taken:taken + in_list])}}});")
            taken += in_list
    return lines
