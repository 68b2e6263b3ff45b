"""What the C++ and Triton expression writers share: an SSA walk over expression roots that
names each node once, and the conditions under which masked subtrees run."""

from __future__ import annotations

from dataclasses import dataclass
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
        contexts = MaskContexts.of(roots)
        start = len(self.lines)
        for root in roots:
            self._emit_tree(root, contexts, ())
        return self.lines[start:]

    def _emit_tree(self, root: Expr, contexts: MaskContexts, pending: tuple[str, ...]) -> None:
        for node in walk(root):
            if node.key in self.names:
                continue
            # Note: only a load runs under its guard (a masked body's other nodes compute on
            # whatever it loaded). A load under several masked bodies is guarded by all their
            # masks, and the walk may reach it inside the first body before the second mask.
            guard = contexts.guards.get(node.key) if node.op is Op.LOAD else None
            for mask in contexts.masks_of(node.key) if guard is not None else ():
                if mask.key in self.names:
                    continue
                if mask.key in pending:
                    raise UnorderedMasks("masked loads whose masks each depend on the other's loads: "
                                         "kiln cannot order them")
                self._emit_tree(mask, contexts, (*pending, mask.key))
            self._emit(node, guard)

    def _emit(self, e: Expr, guard: str | None) -> None:
        raise NotImplementedError


class UnorderedMasks(ValueError):
    """A load that a mask's computation reads, and that runs under that mask too."""


class _Probe(SsaWriter[str]):
    def _emit(self, e: Expr, guard: str | None) -> None:
        self.names[e.key] = e.key


def orderable(roots: list[Expr]) -> bool:
    """Whether the writers can order these roots' masked loads (SsaWriter.emit would not raise)."""
    try:
        _Probe().emit(roots)
    except UnorderedMasks:
        return False
    return True


@dataclass(frozen=True)
class MaskContexts:
    """For each node reached only inside masked bodies: the condition under which it runs, with
    `@key` placeholders the writer swaps for the masks' names; and the masks by key."""

    guards: dict[str, str]
    masks: dict[str, Expr]
    needs: dict[str, tuple[str, ...]]  # node key -> the mask keys its guard names

    @classmethod
    def of(cls, roots: list[Expr]) -> MaskContexts:
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
                stack += [(mask, ctx), (body, tuple(sorted({*ctx, mask.key}))), (other, ctx)]
            else:
                stack += [(a, ctx) for a in node.args]
        contexts = {key: _absorbed(ctxs) for key, ctxs in paths.items() if () not in ctxs}
        return cls({key: _guard_key(ctxs) for key, ctxs in contexts.items()}, masks,
                   {key: tuple(sorted({k for ctx in ctxs for k in ctx})) for key, ctxs in contexts.items()})

    def masks_of(self, key: str) -> list[Expr]:
        return [self.masks[k] for k in self.needs.get(key, ())]


def mask_contexts(roots: list[Expr]) -> dict[str, str]:
    """Each guarded node's condition (MaskContexts.of(roots).guards)."""
    return MaskContexts.of(roots).guards


def _absorbed(ctxs: set[tuple[str, ...]]) -> list[tuple[str, ...]]:
    """The contexts with every one that holds another dropped: (a) || (a && b) is (a)."""
    return sorted(c for c in ctxs if not any(set(o) < set(c) for o in ctxs))


def _guard_key(ctxs: list[tuple[str, ...]]) -> str:
    """A placeholder per mask key; the writer swaps in the mask's name."""
    return " || ".join("(" + " && ".join(f"@{k}" for k in ctx) + ")" for ctx in ctxs)
