"""Channels-last on the cuda target: a convolution net's activations with the channel dim innermost.

cuDNN's half-precision convolutions run on tensor cores in NHWC. Given NCHW tensors, eager's
call transposes its input and weight into NHWC and its result back, three kernels around each
convolution; Inductor avoids them by laying a conv net out channels-last. kiln does too, with
`[lower] layout = "auto"` (contract/config.py):

- a 2-d convolution's weight (a model weight) is laid out channels-last, once, at create (the
  runtime lays a weight out from the file's row-major bytes: kiln_runtime.cpp bind_weights);
- its output buffer is channels-last (its strides: NCHW's dims, NHWC's order in memory);
- a pointwise kernel or reduction of 4-d shape that reads a channels-last buffer writes one:
  its buffer is [N, H, W, C] in row-major, and its value the [N, C, H, W] view of it, so the
  kernel walks memory in order (a BatchNorm and ReLU after a convolution, a residual add, a
  max pool). The next convolution then reads channels-last, as cuDNN takes it.

Note: only where a convolution runs on cuDNN in half precision (tasks/gen_cpp/wrapper.py:
on_cudnn); float32's algorithm choice follows a flag of the caller's process (TF32), and the
cpu target's convolutions are at::convolution's. The results differ from eager's NCHW calls in
their roundings (other cuDNN algorithms), as Inductor's channels-last ones do.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from tasks.ir.dtypes import DType
from tasks.ir.expr import Expr, substitute, var
from tasks.ir.nodes import Buffer, BufferKind, channels_last_strides

CONVOLUTION = "torch.ops.aten.convolution.default"
NCHW_IN_NHWC = (0, 3, 1, 2)  # a value's dim k is the buffer's dim NCHW_IN_NHWC[k]


def takes_channels_last(layout: str, dtype: DType, ndim: int, transposed: bool) -> bool:
    """Whether a convolution of this kind is laid out channels-last (layout: "auto" on the cuda
    target only; the program is traced on the CPU either way)."""
    return layout == "auto" and dtype.is_half and ndim == 4 and not transposed


def relaid_weights(graph: Any, inputs: Sequence[Buffer | None], layout: str) -> list[Buffer | None]:
    """The graph's placeholders, with each 2-d convolution weight channels-last where the
    convolution is laid out so."""
    weights = {b.name: b for b in inputs if b is not None and b.kind is BufferKind.WEIGHT}
    relaid: dict[str, Buffer] = {}
    for node in graph["nodes"]:
        if node["target"] != CONVOLUTION:
            continue
        args = {i["name"]: i["arg"] for i in node["inputs"]}
        name = args.get("weight", {}).get("as_tensor", {}).get("name")
        weight = weights.get(name)
        if weight is None or not takes_channels_last(layout, weight.dtype, len(weight.shape),
                                                     bool(args.get("transposed", {}).get("as_bool"))):
            continue
        relaid[weight.name] = replace(weight, stride=channels_last_strides(weight.shape))
    return [None if b is None else relaid.get(b.name, b) for b in inputs]


def nhwc_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    n, c, h, w = shape
    return (n, h, w, c)


def nhwc_body(expr: Expr) -> Expr:
    """A body over [N, C, H, W]'s loop variables i0..i3, over [N, H, W, C]'s instead."""
    return substitute(expr, {f"i{k}": var(f"i{NCHW_IN_NHWC[k]}") for k in range(1, 4)})
