"""The pool hook a cuda model's CUDA graphs need to hold its calls into torch (matmuls,
convolutions, attention): runtime/kiln_model.h, kiln_model_set_pool_hook.

While the model records, torch's caching allocator routes this thread's allocations to a pool
of the model's own (torch.cuda.MemPool, through torch.cuda.use_mem_pool), as torch.cuda.graph does
for its captures. A block a captured call freed stays in that pool, which only the model's
recordings allocate from, so no later tensor of anyone's is written by a replay. cuBLAS's
workspaces are cleared before and after, as torch's own graph code does, so the one the capture
uses is made in the pool and no later call is handed it.
"""

from __future__ import annotations

import contextlib
import ctypes
from contextlib import AbstractContextManager
from typing import Any

POOL_BEGIN, POOL_END, POOL_RELEASE = 1, 2, 3  # KILN_POOL_* in runtime/kiln_model.h
HOOK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int)  # KilnPoolHook
DEVICE = 0  # a cuda model runs on device 0 (runtime/kiln_cuda.cpp)


class TorchPool:
    """A model's pool; `callback` is the hook to hand to kiln_model_set_pool_hook. Keep this
    object alive until the model is destroyed (its last event, RELEASE, comes then)."""

    def __init__(self) -> None:
        self._pool: Any = None  # torch.cuda.MemPool, made at the first BEGIN
        self._routing: AbstractContextManager[Any] | None = None
        self.failure = ""  # the last recording's failed event, for the report
        self.interrupted: BaseException | None = None  # a Ctrl-C during an event, re-raised after the run
        self.callback = HOOK(self._on_event)

    def _on_event(self, _context: int | None, event: int) -> int:
        # Note: nothing may cross into C: ctypes would print it and return 0, which the runtime
        # reads as success. So every exception, KeyboardInterrupt included, becomes a failure the
        # runtime acts on (a BEGIN: torch's calls run directly; an END: replay off).
        try:
            if event == POOL_BEGIN:
                self._begin()
            elif event == POOL_END:
                self._end()
            elif event == POOL_RELEASE:
                self._end_routing()
                self._pool = None  # after the model's graphs: MemPool's destructor frees the pool
            return 0
        except BaseException as err:  # see the note
            self.failure = f"{type(err).__name__}: {err}"
            if not isinstance(err, Exception):
                self.interrupted = err
            with contextlib.suppress(BaseException):
                self._end_routing()
            return 1

    def _begin(self) -> None:
        import torch

        self.failure = ""
        if self._pool is None:
            self._pool = torch.cuda.MemPool()
        _clear_cublas_workspaces()
        routing = torch.cuda.use_mem_pool(self._pool, device=DEVICE)
        routing.__enter__()
        self._routing = routing
        if not _routes_to(self._pool):
            raise RuntimeError("this thread's allocations already go to another memory pool (a "
                               "torch.cuda.use_mem_pool or a CUDA graph capture around the model's "
                               "first run)")

    def _end(self) -> None:
        try:
            self._end_routing()
        finally:
            _clear_cublas_workspaces()

    def _end_routing(self) -> None:
        routing, self._routing = self._routing, None
        if routing is not None:
            routing.__exit__(None, None, None)


def _routes_to(pool: Any) -> bool:
    """Whether this thread's next allocation on the device lands in `pool`.

    Note: where use_mem_pool is entered inside another routing (a caller's, or torch.compile's
    CUDA graph warm-up), which pool wins is the allocator's choice: torch 2.11 gave the innermost
    (the model's) on an H100, and a torch that gave the outer one would have the graphs write
    blocks the other pool's owner reuses. So the probe asks, rather than trusting either."""
    import torch

    probe = torch.empty(512, dtype=torch.uint8, device=f"cuda:{DEVICE}")
    address = probe.data_ptr()
    try:  # traces are not needed, and may be long where memory history is on
        segments = torch.cuda.memory_snapshot(pool.id, include_traces=False)  # type: ignore[no-untyped-call]
    except TypeError:  # a torch without include_traces
        segments = torch.cuda.memory_snapshot(pool.id)  # type: ignore[no-untyped-call]
    del probe
    return any(tuple(seg.get("segment_pool_id", ())) == tuple(pool.id)
               and seg["address"] <= address < seg["address"] + seg["total_size"] for seg in segments)


def usable() -> str:
    """Why torch's allocator cannot give a model a pool of its own ("" where it can)."""
    import torch

    backend = torch.cuda.get_allocator_backend()
    return "" if backend == "native" else f"torch's CUDA allocator is {backend!r}, which has no memory pools"


def _clear_cublas_workspaces() -> None:
    """Drop torch's cuBLAS workspaces (each is made again at its next use). Before a recording,
    so that the one it uses is made in the model's pool; after it, so that the pool's is never
    handed to a later call. torch.cuda.graph and torch.compile's CUDA graphs do the same."""
    import torch

    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is None:
        raise RuntimeError("this torch cannot clear its cuBLAS workspaces "
                           "(torch._C._cuda_clearCublasWorkspaces)")
    clear()
