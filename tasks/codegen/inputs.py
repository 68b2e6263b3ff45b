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
        direct = {str(load.arg) for load in _direct_loads(e)}
        for inner in walk(e):
            if inner.op is Op.LOAD and not inner.dtype.is_float:
                name = str(inner.arg)
                # Note: an integer that is the index itself (gather, embedding, scatter; maybe
                # wrapped when negative) may take any value below the size. One that is only
                # part of it (max_unpool's per-plane position plus the plane's offset) gets
                # zeros: no bound on its own values keeps the sum in range, and a kernel run
                # on a position that does not exist writes outside its buffer.
                limit = size if name in direct else 1
                bounds[name] = min(bounds.get(name, limit), limit)


def _direct_loads(e: Expr) -> list[Expr]:
    """The integer loads that are `e` itself, through casts, a where's branches and the
    `i + size` that wraps a negative index."""
    if e.op is Op.LOAD:
        return [e]
    if e.op is Op.CAST:
        return _direct_loads(e.args[0])
    if e.op is Op.WHERE:
        return _direct_loads(e.args[1]) + _direct_loads(e.args[2])
    if e.op is Op.ADD and any(a.op is Op.CONST for a in e.args):
        return [x for a in e.args for x in _direct_loads(a)]
    return []
