"""The schedule's checker: kernels are self-contained and well-formed, steps read only what was
written before them, and no two live arena buffers share a byte. Tests run it on every schedule."""

from __future__ import annotations

from tasks.ir.expr import loads, var
from tasks.ir.nodes import Buffer, Pointwise, Reduction, Scatter, children
from tasks.ir.verify import IRError, check_expr
from tasks.schedule.model import Kernel, Schedule, ScheduledGraph
from tasks.schedule.passes import Run, liveness, step_io


def verify_schedule(s: Schedule) -> None:
    names = [k.name for k in s.kernels]
    if len(set(names)) != len(names):
        raise IRError("kernel names repeat")
    for k in s.kernels:
        verify_kernel(k)
    _verify_graph(s, s.main, "main")


def verify_kernel(k: Kernel) -> None:
    where = f"kernel {k.name}"
    known: dict[str, Buffer] = {p.name: p.spec for p in k.params}
    written = {p.name for p in k.params if p.role == "inout"}
    x, r = len(k.ranges), len(k.reduce_ranges)
    row = {f"i{n}" for n in range(x)}
    full = row | {f"r{n}" for n in range(r)}
    for node in k.nodes:
        if isinstance(node, Pointwise):
            is_full = node.out.shape != k.ranges
            if is_full and node.out.shape != k.ranges + k.reduce_ranges:
                raise IRError(f"{where}: node {node.out.name} of shape {node.out.shape} "
                              "fits neither X nor X x R")
            check_expr(node.body, known, full if is_full else row, where)
            outs = [node.out]
        elif isinstance(node, Reduction):
            if (node.ranges, node.reduce_ranges) != (k.ranges, k.reduce_ranges):
                raise IRError(f"{where}: reduction over {node.ranges} x {node.reduce_ranges} in a kernel "
                              f"over {k.ranges} x {k.reduce_ranges}")
            check_expr(node.body, known, full, where)
            outs = list(node.outs)
        else:
            assert isinstance(node, Scatter)
            for e in (*node.index, node.value):
                check_expr(e, known, row, where)
            outs = []
        _check_local_reads(k, node, where)
        for b in outs:
            if b.name in known and b.name not in {p.name for p in k.params if p.role == "out"}:
                raise IRError(f"{where}: {b.name} written twice")
            known[b.name] = b
            written.add(b.name)
    missing = {p.name for p in k.params if p.role == "out"} - written
    if missing:
        raise IRError(f"{where}: outputs {sorted(missing)} are never written")
    _check_stages(k, where)


def _check_stages(k: Kernel, where: str) -> None:
    counts = [0] * len(k.nodes)
    for stage in k.stages:
        for i in stage.nodes:
            counts[i] += 1
            node = k.nodes[i]
            row = isinstance(node, Pointwise) and node.out.shape == k.ranges
            if stage.loop == row and k.reduce_ranges:
                raise IRError(f"{where}: node {i} is in a {'pass' if stage.loop else 'row'} stage")
    for i, (node, n) in enumerate(zip(k.nodes, counts, strict=True)):
        once = not (isinstance(node, Pointwise) and node.out.shape != k.ranges)
        if n == 0 or (once and n > 1):
            raise IRError(f"{where}: node {i} runs {n} times in the stages")


def _check_local_reads(k: Kernel, node: Pointwise | Reduction | Scatter, where: str) -> None:
    local = {b.name: b for b in k.locals}
    roots = [node.body] if not isinstance(node, Scatter) else [*node.index, node.value]
    for root in roots:
        for load in loads(root):
            b = local.get(str(load.arg))
            if b is None:
                continue
            x = len(k.ranges)
            want = [var(f"i{d}") if d < x else var(f"r{d - x}") for d in range(len(b.shape))]
            # Note: a dimension of size one is indexed by the constant 0, whatever its variable.
            if any(a != w for a, w, size in zip(load.args, want, b.shape, strict=True) if size != 1):
                raise IRError(f"{where}: local {b.name} is read away from where it is computed")


def _verify_graph(s: Schedule, g: ScheduledGraph, where: str) -> None:
    run = Run(kernels=list(s.kernels))
    ready = {b.name for b in g.inputs}
    for i, step in enumerate(g.steps):
        reads, writes = step_io(step, run)
        unready = [b for b in reads if b not in ready]
        if unready:
            raise IRError(f"{where}: step {i} reads {unready} before any step writes them")
        ready.update(writes)
        for part, sub in children(step):
            _verify_graph(s, sub, f"{where}.{part}")
    missing = [o for o in g.outputs if o not in ready]
    if missing:
        raise IRError(f"{where}: outputs {missing} are never written")
    overlaps = arena_overlaps(g, run)
    if overlaps:
        raise IRError(f"{where}: live buffers share arena bytes: {overlaps[:3]}")


def arena_overlaps(g: ScheduledGraph, run: Run) -> list[str]:
    """Pairs of arena buffers live at the same step that share bytes (there must be none)."""
    first, last = liveness(g.steps, run, g.epilogues)
    offsets = dict(g.arena)
    sizes = {b.name: b.nbytes for b in g.buffers}
    names = sorted(offsets)
    bad = []
    for n, a in enumerate(names):
        for b in names[n + 1:]:
            live = first[a] <= last[b] and first[b] <= last[a]
            share = offsets[a] < offsets[b] + sizes[b] and offsets[b] < offsets[a] + sizes[a]
            if live and share and sizes[a] and sizes[b]:
                bad.append(f"{a} and {b}")
    return bad
