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
        self.failure = ""  # the last event that failed, for the report
        self.callback = HOOK(self._on_event)

    def _on_event(self, _context: int | None, event: int) -> int:
        # Note: an exception must not cross into C (ctypes would print it and return 0): it is
        # kept and the runtime told, which turns replay off and says the hook failed.
        try:
            if event == POOL_BEGIN:
                self._begin()
            elif event == POOL_END:
                self._end()
            elif event == POOL_RELEASE:
                self._pool = None  # after the model's graphs: MemPool's destructor frees the pool
            return 0
        except Exception as err:  # torch's own failure, whatever its type
            self.failure = f"{type(err).__name__}: {err}"
            return 1

    def _begin(self) -> None:
        import torch

        if self._pool is None:
            self._pool = torch.cuda.MemPool()
        _clear_cublas_workspaces()
        routing = torch.cuda.use_mem_pool(self._pool, device=DEVICE)
        routing.__enter__()
        self._routing = routing

    def _end(self) -> None:
        routing, self._routing = self._routing, None
        try:
            if routing is not None:
                routing.__exit__(None, None, None)
        finally:
            _clear_cublas_workspaces()


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
