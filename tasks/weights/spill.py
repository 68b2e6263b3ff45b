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
behind, and its blocks are reserved first (posix_fallocate): on a filesystem that rewrites in
place (ext4, xfs), a full disk refuses the spill (the tensor stays in memory) instead of
raising SIGBUS on a write to the mapping later; a copy-on-write one (btrfs, zfs) can still
fault a write when full, which kills the stage's worker, never the caller or the cache.

What is not spilled: tensors of a dtype the weights file cannot hold, quantized, sparse or
subclass tensors, tensors that require grad (a copy would not be a leaf), and everything where
the scratch folder is in memory (tmpfs, ramfs), where a mapping would only move pages from the
process's RSS to shared memory that cannot be reclaimed. While a mapping's tensor lives, the
mapping keeps a file descriptor (Python's mmap does); at most half the soft limit of them are
used, and later tensors stay in memory. A spilled tensor cannot grow (resize_ to a larger size
raises), as no weight init does.
"""

from __future__ import annotations

import mmap
import os
import resource
import tempfile
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves

_MIN_BYTES = 1 << 20  # smaller tensors are not worth a mapping each
_IN_MEMORY = frozenset({"tmpfs", "ramfs"})
_DTYPES = frozenset({torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64,
                     torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool})

# Calls whose result is a fresh tensor (when it is not one of their arguments, checked below).
_MAKERS: frozenset[Callable[..., Any]] = frozenset({
    torch.empty, torch.zeros, torch.ones, torch.full, torch.arange, torch.eye, torch.rand,
    torch.randn, torch.randint, torch.empty_like, torch.zeros_like, torch.ones_like,
    torch.full_like, torch.Tensor.to, torch.Tensor.type, torch.Tensor.clone, torch.Tensor.float,
    torch.Tensor.half, torch.Tensor.bfloat16, torch.Tensor.double,
})
# Makers whose values are unspecified: their tensor moves without a copy (a parameter's
# torch.empty, before its init writes it, is most of what a build makes).
_UNSET: frozenset[Callable[..., Any]] = frozenset({torch.empty, torch.empty_like})


class Spill:
    """The scratch mappings of one build; `building()` spills while a model is made, and
    `release(t)` hands a mapped tensor's pages back after a later read (the weights' write)."""

    def __init__(self, folder: Path) -> None:
        self._folder = folder
        self.on = _filesystem(folder) not in _IN_MEMORY
        # a mapping's address -> the mapping, while a tensor holds it (torch.frombuffer does)
        self._maps: weakref.WeakValueDictionary[int, mmap.mmap] = weakref.WeakValueDictionary()
        self._most = resource.getrlimit(resource.RLIMIT_NOFILE)[0] // 2
        self.spilled_bytes = 0

    @contextmanager
    def building(self) -> Iterator[None]:
        with _SpillMode(self):
            yield

    def release(self, values: Any) -> None:
        """Hand back the pages of every mapped tensor among values (a pytree)."""
        addresses = {_address(t) for t in tree_leaves(values) if isinstance(t, torch.Tensor)}
        for address in addresses:
            found = self._maps.get(address)
            if found is not None:
                found.madvise(mmap.MADV_DONTNEED)

    def moved(self, made: Any, arguments: Any, copy: bool = True) -> Any:
        """made, moved into a mapping of its own when it is a large fresh CPU tensor (its values
        copied, unless `copy` is False: they are unspecified)."""
        if not self.on or len(self._maps) >= self._most or not _spillable(made):
            return made
        address = _address(made)
        if address in self._maps or any(_address(t) == address for t in tree_leaves(arguments)
                                        if isinstance(t, torch.Tensor)):
            return made
        size = made.numel() * made.element_size()
        mapping = self._mapping(size)
        if mapping is None:
            return made
        spilled = torch.frombuffer(mapping, dtype=made.dtype, count=made.numel()).view(made.shape)
        self._maps[_address(spilled)] = mapping
        if copy:
            with torch.no_grad():
                spilled.copy_(made)
        self.spilled_bytes += size
        return spilled

    def _mapping(self, size: int) -> mmap.mmap | None:
        try:
            fd, name = tempfile.mkstemp(prefix=".spill-", dir=self._folder)
        except OSError:  # no inode, no permission, no descriptor left: this tensor stays in memory
            return None
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
            result = self._spill.moved(result, (args, kwargs), copy=func not in _UNSET)
        self._spill.release((args, kwargs, result))
        return result


def _spillable(t: Any) -> bool:
    return (isinstance(t, torch.Tensor) and type(t) is torch.Tensor and t.dtype in _DTYPES
            and not t.requires_grad and _address(t) != -1 and t.is_contiguous()
            and t.storage_offset() == 0 and t.numel() * t.element_size() >= _MIN_BYTES
            and t.untyped_storage().nbytes() == t.numel() * t.element_size())


def _address(t: torch.Tensor) -> int:
    """The address of a dense CPU tensor's storage, or -1 (another device or layout, quantized,
    mkldnn, or a subclass without storage)."""
    if t.device.type != "cpu" or t.layout != torch.strided or t.is_mkldnn or t.is_quantized:
        return -1
    try:
        return int(t.untyped_storage().data_ptr())
    except (RuntimeError, NotImplementedError):
        return -1


def _filesystem(folder: Path) -> str:
    """The type of the filesystem folder is on (/proc/self/mounts' longest prefix), or ""."""
    path, found, best = folder.resolve().as_posix(), "", -1
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return ""
    for line in lines:
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        inside = path == point or path.startswith(point.rstrip("/") + "/")
        if inside and len(point) > best:
            found, best = fields[2], len(point)
    return found
