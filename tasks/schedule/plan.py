"""The buffer plan: every temporary of a graph placed in one arena, reusing memory by liveness.

A buffer lives from the step that writes it to the last step that reads it. Buffers are placed
in the order they are written, each at the lowest offset where it overlaps no buffer that is
still live (first fit); a buffer freed by a step is reusable only from the next step on, since
a kernel may read its inputs while writing its outputs. Graph outputs are not in the arena:
the caller owns them.
"""

from __future__ import annotations

from dataclasses import dataclass

from tasks.ir.nodes import Buffer

ALIGN = 64  # bytes: a cache line, and enough for any vector load


@dataclass(frozen=True)
class Interval:
    buffer: Buffer
    first: int  # the step that writes it
    last: int  # the last step that reads it


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def plan_arena(intervals: list[Interval]) -> tuple[dict[str, int], int]:
    placed: list[tuple[int, int, Interval]] = []  # (offset, size, interval)
    offsets: dict[str, int] = {}
    top = 0
    for iv in sorted(intervals, key=lambda iv: (iv.first, iv.buffer.name)):
        size = _align(iv.buffer.nbytes)
        live = sorted((off, sz) for off, sz, other in placed if other.last >= iv.first and sz)
        offset = 0
        for off, sz in live:
            if offset + size <= off:
                break
            offset = max(offset, off + sz)
        offsets[iv.buffer.name] = offset
        placed.append((offset, size, iv))
        top = max(top, offset + size)
    return offsets, top
