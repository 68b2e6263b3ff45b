"""What the C++ and Triton expression writers share: an SSA walk over expression roots that
names each node once, and the conditions under which masked subtrees run."""

from __future__ import annotations

from typing import Generic, TypeVar

from tasks.ir.expr import Expr, Op, walk

Name = TypeVar("Name")


class SsaWriter(Generic[Name]):
    """Emits one statement per expression node, each node once across calls; `ref(e)` is its name
    (a subclass's `_emit` writes the statement and records the name)."""

    def __init__(self) -> None:
        self.names: dict[str, Name] = {}
        self.lines: list[str] = []

    def ref(self, e: Expr) -> Name:
        return self.names[e.key]

    def emit(self, roots: list[Expr]) -> list[str]:
        """The new statements that compute roots (nodes named by earlier calls are reused)."""
        guards = mask_contexts(roots)
        start = len(self.lines)
        for root in roots:
            for node in walk(root):
                if node.key not in self.names:
                    self._emit(node, guards.get(node.key))
        return self.lines[start:]

    def _emit(self, e: Expr, guard: str | None) -> None:
        raise NotImplementedError


def mask_contexts(roots: list[Expr]) -> dict[str, str]:
    """For each node reached only inside masked bodies: the condition under which it runs, with
    `@key` placeholders the writer swaps for the masks' names."""
    paths: dict[str, set[tuple[str, ...]]] = {}
    stack: list[tuple[Expr, tuple[str, ...]]] = [(r, ()) for r in roots]
    seen: set[tuple[str, tuple[str, ...]]] = set()
    masks: dict[str, Expr] = {}
    while stack:
        node, ctx = stack.pop()
        if (node.key, ctx) in seen:
            continue
        seen.add((node.key, ctx))
        paths.setdefault(node.key, set()).add(ctx)
        if node.op is Op.MASKED:
            mask, body, other = node.args
            masks[mask.key] = mask
            stack += [(mask, ctx), (body, (*ctx, mask.key)), (other, ctx)]
        else:
            stack += [(a, ctx) for a in node.args]
    return {key: _guard_key(ctxs) for key, ctxs in paths.items() if () not in ctxs}


def _guard_key(ctxs: set[tuple[str, ...]]) -> str:
    """A placeholder per mask key; the writer swaps in the mask's name."""
    return " || ".join("(" + " && ".join(f"@{k}" for k in sorted(ctx)) + ")" for ctx in sorted(ctxs))
