"""A model built for its weights without holding them in memory.

While the weights stage builds a model with its seeded init, every large tensor a factory or a
conversion makes (torch.empty, torch.zeros, Tensor.to, ...) is moved into a shared mapping of
its own scratch file, and after each torch call the pages of the mapped tensors it touched go
back to the page cache (madvise DONTNEED keeps a shared file mapping's contents). The process
then holds one tensor's pages at a time, not the model: bert's weights stage peaked at its
imports plus every parameter plus the decoder weight that tying replaces (959 MB); the weights
now pass through the page cache, as a mapped checkpoint's would.

The values are the ones a plain build makes, bit for bit: the same calls run in the same order
on the same generator, and only where their results live changes. A tensor made some other way
(torch.from_numpy, a C++ extension) stays where it was made.

Note: each scratch file is unlinked as soon as it is mapped, so a killed worker leaves no file
behind, and its blocks are reserved first (posix_fallocate): a full disk refuses the spill
(the tensor stays in memory) instead of raising SIGBUS on a write to the mapping later.
"""

from __future__ import annotations

import mmap
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves

_MIN_BYTES = 1 << 20  # smaller tensors are not worth a mapping each

# Calls whose result is a fresh tensor (when it is not one of their arguments, checked below).
_MAKERS: frozenset[Callable[..., Any]] = frozenset({
    torch.empty, torch.zeros, torch.ones, torch.full, torch.arange, torch.eye, torch.rand,
    torch.randn, torch.randint, torch.empty_like, torch.zeros_like, torch.ones_like,
    torch.full_like, torch.Tensor.to, torch.Tensor.type, torch.Tensor.clone, torch.Tensor.float,
    torch.Tensor.half, torch.Tensor.bfloat16, torch.Tensor.double,
})


class Spill:
    """The scratch mappings of one build; `building()` spills while a model is made, and
    `release(t)` hands a mapped tensor's pages back after a later read (the weights' write)."""

    def __init__(self, folder: Path) -> None:
        self._folder = folder
        self._maps: dict[int, mmap.mmap] = {}  # a mapping's address -> the mapping

    @property
    def spilled_bytes(self) -> int:
        return sum(len(m) for m in self._maps.values())

    @contextmanager
    def building(self) -> Iterator[None]:
        with _SpillMode(self):
            yield

    def release(self, tensor: torch.Tensor) -> None:
        found = self._maps.get(_address(tensor))
        if found is not None:
            found.madvise(mmap.MADV_DONTNEED)

    def released_all(self, values: Any) -> None:
        addresses = {_address(t) for t in tree_leaves(values) if isinstance(t, torch.Tensor)}
        for address in addresses:
            found = self._maps.get(address)
            if found is not None:
                found.madvise(mmap.MADV_DONTNEED)

    def moved(self, made: Any, arguments: Any) -> Any:
        """made, moved into a mapping of its own when it is a large fresh CPU tensor."""
        if not _spillable(made) or _address(made) in self._maps:
            return made
        if any(_address(t) == _address(made) for t in tree_leaves(arguments) if isinstance(t, torch.Tensor)):
            return made
        mapping = self._mapping(made.numel() * made.element_size())
        if mapping is None:
            return made
        self._maps[_address_of(mapping)] = mapping
        spilled = torch.frombuffer(mapping, dtype=made.dtype, count=made.numel()).view(made.shape)
        spilled.copy_(made)
        return spilled.requires_grad_(made.requires_grad)

    def _mapping(self, size: int) -> mmap.mmap | None:
        fd, name = tempfile.mkstemp(prefix=".spill-", dir=self._folder)
        try:
            os.unlink(name)
            os.posix_fallocate(fd, 0, size)
            return mmap.mmap(fd, size)
        except OSError:
            return None
        finally:
            os.close(fd)


class _SpillMode(TorchFunctionMode):
    def __init__(self, spill: Spill) -> None:
        super().__init__()
        self._spill = spill

    def __torch_function__(self, func: Callable[..., Any], types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        if func in _MAKERS:
            result = self._spill.moved(result, (args, kwargs))
        self._spill.released_all((args, kwargs, result))
        return result


def _spillable(t: Any) -> bool:
    return (isinstance(t, torch.Tensor) and type(t) is torch.Tensor and t.device.type == "cpu"
            and t.layout == torch.strided and t.is_contiguous() and t.storage_offset() == 0
            and t.numel() * t.element_size() >= _MIN_BYTES
            and t.untyped_storage().nbytes() == t.numel() * t.element_size())


def _address(t: torch.Tensor) -> int:
    return int(t.untyped_storage().data_ptr()) if t.device.type == "cpu" else -1


def _address_of(mapping: mmap.mmap) -> int:
    view = torch.frombuffer(mapping, dtype=torch.uint8, count=1)
    return int(view.untyped_storage().data_ptr())
