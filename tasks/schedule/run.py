"""The interpreter for a schedule: kernels run node by node on tensors carved from the arena.

Every temporary lives at its planned offset in one byte tensor, so a buffer plan that lets two
live buffers overlap gives wrong answers here, and the tests catch it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import torch

from tasks.ir.interpret import Alloc, Env, empty, evaluate, reduce, run_node, torch_dtype, view_of
from tasks.ir.nodes import Buffer, Cond, Pointwise, Reduction, Scatter, View
from tasks.schedule.model import CallStep, Kernel, KernelStep, Schedule, ScheduledGraph, WhileStep


def run_schedule(s: Schedule, args: Mapping[str, torch.Tensor]) -> list[torch.Tensor]:
    return run_graph(s, s.main, args)


def run_graph(s: Schedule, g: ScheduledGraph, args: Mapping[str, torch.Tensor]) -> list[torch.Tensor]:
    arena = torch.empty(g.arena_bytes, dtype=torch.uint8)
    offsets = dict(g.arena)

    def alloc(b: Buffer) -> torch.Tensor:
        if b.name not in offsets:
            return empty(b)
        raw = arena[offsets[b.name]:offsets[b.name] + b.nbytes]
        return raw.view(torch_dtype(b.dtype)).as_strided(b.shape, b.stride)

    env: Env = {b.name: args[b.name] for b in g.inputs}
    for step in g.steps:
        if isinstance(step, KernelStep):
            run_kernel(s.kernel(step.kernel), env, alloc)
        elif isinstance(step, CallStep):
            run_node(step.node, env, alloc)
        elif isinstance(step, Cond):
            sub = step.then_graph if bool(view_of(step.pred, env).item()) else step.else_graph
            _bind(step.outs, run_graph(s, sub, _operands(sub, step.operands, env)), env, alloc)
        else:
            _run_while(s, step, env, alloc)
    return [env[name] for name in g.outputs]


def _operands(sub: ScheduledGraph, views: tuple[View, ...], env: Env) -> dict[str, torch.Tensor]:
    return {b.name: view_of(v, env) for b, v in zip(sub.inputs, views, strict=True)}


def _bind(outs: tuple[Buffer, ...], values: list[torch.Tensor], env: Env, alloc: Alloc) -> None:
    for b, value in zip(outs, values, strict=False):
        env[b.name] = alloc(b)
        env[b.name].copy_(value)


def _run_while(s: Schedule, step: WhileStep, env: Env, alloc: Alloc) -> None:
    carried = [view_of(v, env).clone() for v in step.carried]
    extra = [view_of(v, env) for v in step.extra]

    def call(sub: ScheduledGraph) -> list[torch.Tensor]:
        return run_graph(s, sub, {b.name: t for b, t in zip(sub.inputs, [*carried, *extra], strict=True)})

    while bool(call(step.cond_graph)[0].item()):
        carried = [t.clone() for t in call(step.body_graph)]
    _bind(step.outs, carried, env, alloc)


def run_kernel(k: Kernel, env: Env, alloc: Alloc) -> None:
    """Run a kernel stage by stage. A full local is dropped when its pass ends, so a later pass
    that reads it without computing it again fails here, as it would in generated code."""
    local: Env = {}
    for p in k.params:
        if p.role == "out" and p.buffer not in env:
            env[p.buffer] = alloc(replace(p.spec, name=p.buffer))
        local[p.name] = env[p.buffer]
    locals_by_name = {b.name for b in k.locals}
    for stage in k.stages:
        for i in stage.nodes:
            _run_kernel_node(k, k.nodes[i], local)
        if stage.loop:
            for i in stage.nodes:
                node = k.nodes[i]
                if isinstance(node, Pointwise) and node.out.name in locals_by_name:
                    del local[node.out.name]


def _run_kernel_node(k: Kernel, node: Pointwise | Reduction | Scatter, local: Env) -> None:
    if isinstance(node, Pointwise):
        full = node.out.shape != k.ranges
        ranges, reduce_ranges = (k.ranges, k.reduce_ranges) if full else (node.out.shape, ())
        value = evaluate(node.body, local, ranges, reduce_ranges).reshape(node.out.shape)
        _store(local, node.out, value)
    elif isinstance(node, Reduction):
        for b, v in zip(node.outs, reduce(node, local), strict=True):
            _store(local, b, v.expand(b.shape))
    else:
        run_node(node, local)


def _store(local: Env, b: Buffer, value: torch.Tensor) -> None:
    target = local.get(b.name)
    if target is None:
        target = local[b.name] = empty(b)
    target.copy_(value)
