"""What lowering passes around: tensors as views of buffers, and the loop a body is built in.

A `TensorValue` is a buffer seen through an index map: `index[k]` gives the buffer's k-th index
as an expression of the value's own loop variables v0..vn. A pointwise op's result is the
identity view of the buffer its node computes; a view op only builds a new index map, so views
never copy: they become index expressions in the loads of whoever consumes them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tasks.ir import index as ix
from tasks.ir.dtypes import DType
from tasks.ir.expr import Expr, Op, load, substitute, var
from tasks.ir.nodes import Buffer, View


def view_var(k: int) -> Expr:
    return var(f"v{k}")


@dataclass(frozen=True, slots=True)
class TensorValue:
    buffer: Buffer
    shape: tuple[int, ...]
    index: tuple[Expr, ...]  # the buffer's indices, over v0..v{len(shape)-1}

    @property
    def dtype(self) -> DType:
        return self.buffer.dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @staticmethod
    def of(buffer: Buffer) -> TensorValue:
        return TensorValue(buffer, buffer.shape, tuple(view_var(k) for k in range(len(buffer.shape))))

    def is_identity(self) -> bool:
        return self.shape == self.buffer.shape and self.index == TensorValue.of(self.buffer).index

    def ranges(self) -> dict[str, int]:
        return {f"v{k}": size for k, size in enumerate(self.shape)}

    def reindex(self, shape: tuple[int, ...], old_index: tuple[Expr, ...]) -> TensorValue:
        """A view: `old_index` gives this value's indices over the new value's v0..vm."""
        assert len(old_index) == self.ndim
        values = {f"v{k}": e for k, e in enumerate(old_index)}
        ranges = {f"v{k}": size for k, size in enumerate(shape)}
        new = tuple(ix.simplify(substitute(e, values), ranges) for e in self.index)
        return TensorValue(self.buffer, shape, new)

    def at(self, indices: tuple[Expr, ...], ranges: ix.Ranges) -> Expr:
        """A load of this value at `indices` (expressions of the consumer's loop variables)."""
        assert len(indices) == self.ndim, (indices, self.shape)
        values = {f"v{k}": e for k, e in enumerate(indices)}
        base = tuple(ix.simplify(substitute(e, values), ranges) for e in self.index)
        return load(self.buffer.name, self.dtype, base)

    def strided(self) -> View | None:
        """This value as (shape, stride, offset) over its buffer, if its index map is affine."""
        # Note: the address as a whole, not dim by dim: a merge of contiguous dims (a reshape of
        # [2, 32, 128] to [64, 128]) reads (v0 // 32) * 4096 + (v0 % 32) * 128, which folds to
        # v0 * 128 only once both dims' terms are summed.
        address: dict[Expr, int] = {}
        offset = 0
        for e, base_stride in zip(self.index, self.buffer.stride, strict=True):
            terms, constant = ix.linear(e)
            offset += constant * base_stride
            for atom, coef in terms.items():
                address[atom] = address.get(atom, 0) + coef * base_stride
        folded, constant = ix.fold_divmod(address)
        strides = [0] * self.ndim
        for atom, coef in folded.items():
            if atom.op is not Op.VAR or not str(atom.arg).startswith("v"):
                return None
            strides[int(str(atom.arg)[1:])] += coef
        return View(self.buffer.name, self.shape, tuple(strides), offset + constant, self.dtype)


@dataclass(frozen=True, slots=True)
class Loop:
    """The loop a body is built in: variables i0..in over `shape`, r0.. over `reduce`."""

    shape: tuple[int, ...]
    reduce: tuple[int, ...] = ()

    @property
    def idx(self) -> tuple[Expr, ...]:
        return tuple(var(f"i{k}") for k in range(len(self.shape)))

    @property
    def ridx(self) -> tuple[Expr, ...]:
        return tuple(var(f"r{k}") for k in range(len(self.reduce)))

    @property
    def ranges(self) -> dict[str, int]:
        out = {f"i{k}": size for k, size in enumerate(self.shape)}
        out.update({f"r{k}": size for k, size in enumerate(self.reduce)})
        return out

    def load(self, value: TensorValue, indices: tuple[Expr, ...]) -> Expr:
        return value.at(indices, self.ranges)

    def broadcast_load(self, value: TensorValue) -> Expr:
        """value read at this loop's index, numpy-broadcast to the loop's shape."""
        return self.load(value, broadcast_index(value.shape, self.shape, self.idx))


def broadcast_index(shape: tuple[int, ...], out_shape: tuple[int, ...],
                    idx: tuple[Expr, ...]) -> tuple[Expr, ...]:
    lead = len(out_shape) - len(shape)
    return tuple(ix.const(0) if size == 1 and out_shape[lead + k] != 1 else idx[lead + k]
                 for k, size in enumerate(shape))
