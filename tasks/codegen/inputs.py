"""What random inputs a kernel may be given: tuning runs kernels on random data, and an integer
tensor that a kernel reads as an index must hold only positions that exist."""

from __future__ import annotations

from tasks.ir.expr import Expr, Op, walk
from tasks.ir.nodes import Pointwise, Reduction, Scatter
from tasks.schedule.model import Kernel


def index_bounds(k: Kernel) -> dict[str, int]:
    """Integer parameter -> an exclusive upper bound for its values (from 0): the smallest size
    of any dimension it indexes. Parameters never used as an index are absent."""
    shapes = {p.name: p.spec.shape for p in k.params} | {b.name: b.shape for b in k.locals}
    bounds: dict[str, int] = {}
    for root, target in _roots(k):
        for load in (e for e in walk(root) if e.op is Op.LOAD):
            _bound_by(load.args, shapes[str(load.arg)], bounds)
        if target is not None:
            _bound_by(target[0], shapes[target[1]], bounds)
    return bounds


def _roots(k: Kernel) -> list[tuple[Expr, tuple[tuple[Expr, ...], str] | None]]:
    roots: list[tuple[Expr, tuple[tuple[Expr, ...], str] | None]] = []
    for node in k.nodes:
        if isinstance(node, Pointwise | Reduction):
            roots.append((node.body, None))
        elif isinstance(node, Scatter):
            roots += [(e, None) for e in (*node.index, node.value)]
            roots.append((node.value, (node.index, node.target)))
    return roots


def _bound_by(indices: tuple[Expr, ...], shape: tuple[int, ...], bounds: dict[str, int]) -> None:
    for e, size in zip(indices, shape, strict=True):
        for inner in walk(e):
            if inner.op is Op.LOAD and not inner.dtype.is_float:
                name = str(inner.arg)
                bounds[name] = min(bounds.get(name, size), size)
