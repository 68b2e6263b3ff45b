"""Loading a build: model.so through its C API (runtime/kiln_model.h), as a callable on tensors.

Tensors cross as torch's stable C shim handles: `unsafe_alloc_void_ptrs_from_tensors` gives a
new handle per input (deleted after the call), and outputs come back as new handles that
`alloc_tensors_by_stealing_from_void_ptrs` turns into tensors without a copy.
"""

from __future__ import annotations

import ctypes
import json
import os
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cache.hashing import digest_data
from contract.errors import KilnError
from contract.return_types import register_named_in
from kiln import cuda_pool
from pipeline.integrity import (
    MODEL_SO,
    WEIGHTS,
    BuildManifest,
    check_digest,
    check_size,
    check_weights_header,
    read_manifest,
)

ABI_VERSION = 2  # KILN_ABI_VERSION in runtime/kiln_model.h
_BAD_ARGUMENT, _BAD_WEIGHTS = 1, 2
_CREATE_NO_VERIFY = 1  # KILN_CREATE_NO_VERIFY
_CREATE_NO_GRAPHS = 2  # KILN_CREATE_NO_GRAPHS

_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


class ModelInputError(ValueError):
    """Inputs a compiled model cannot take: their number, shape, dtype or device."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: str  # torch's name: "float32", "int64", ...


def _declare(lib: ctypes.CDLL) -> None:
    size, model = ctypes.c_size_t, ctypes.c_void_p
    lib.kiln_abi_version.restype = ctypes.c_int
    lib.kiln_last_error.restype = ctypes.c_char_p
    lib.kiln_model_create_with.argtypes = [ctypes.c_char_p, ctypes.c_uint, ctypes.POINTER(ctypes.c_void_p)]
    lib.kiln_model_destroy.argtypes = [model]
    lib.kiln_model_run.argtypes = [model, ctypes.c_void_p, size, ctypes.c_void_p, size]
    for side in ("input", "output"):
        getattr(lib, f"kiln_model_num_{side}s").argtypes = [model]
        getattr(lib, f"kiln_model_num_{side}s").restype = size
        for what, restype in (("name", ctypes.c_char_p), ("dtype", ctypes.c_char_p), ("ndim", size),
                              ("sizes", ctypes.POINTER(ctypes.c_int64)),
                              ("strides", ctypes.POINTER(ctypes.c_int64))):
            fn = getattr(lib, f"kiln_model_{side}_{what}")
            fn.argtypes, fn.restype = [model, size], restype
    lib.kiln_model_target.restype = ctypes.c_char_p
    if hasattr(lib, "kiln_model_replay"):  # a model.so from before CUDA graphs has none
        lib.kiln_model_replay.argtypes = [model]
        lib.kiln_model_replay.restype = ctypes.c_char_p
    if hasattr(lib, "kiln_model_set_pool_hook"):  # nor this, from before torch's calls were captured
        lib.kiln_model_set_pool_hook.argtypes = [model, cuda_pool.HOOK, ctypes.c_void_p]
        lib.kiln_model_set_pool_hook.restype = ctypes.c_int
    lib.aoti_torch_delete_tensor_object.argtypes = [ctypes.c_void_p]


def open_library(so: Path, manifest: BuildManifest | None = None, verify: bool = True) -> ctypes.CDLL:
    """dlopen `so` by its content: a private copy, loaded once per content in this process;
    checked first against the build's manifest (its size always, its digest if `verify`).

    Note: the dynamic loader hands back a library already loaded under the same path, so a build
    compiled into a folder that an earlier build of this process was loaded from (two in-memory
    modules of one class, compiled in a row) would run the earlier build's code. A copy under a
    name of its own is loaded afresh (the copy is removed once mapped); the same bytes loaded
    again share that library, as one path did before.
    """
    data = so.read_bytes()
    digest = digest_data(data)
    if manifest is not None:
        check_size(manifest, so)
        if verify:
            check_digest(manifest, so, digest)
    if digest not in _LIBRARIES:
        _LIBRARIES[digest] = _load_copy(so, data)
    return _LIBRARIES[digest]


_LIBRARIES: dict[str, ctypes.CDLL] = {}


def _load_copy(so: Path, data: bytes) -> ctypes.CDLL:
    failures = []
    for folder in (tempfile.gettempdir(), str(so.parent)):  # the build's folder where tmp is noexec
        try:
            fd, name = tempfile.mkstemp(prefix=".kiln-", suffix=f"-{so.name}", dir=folder)
        except OSError as err:
            failures.append(f"{folder}: {err.strerror}")
            continue
        try:
            with os.fdopen(fd, "wb") as copy:
                copy.write(data)
            return ctypes.CDLL(name)
        except OSError as err:
            failures.append(str(err).replace(name, str(so)))
        finally:
            os.unlink(name)
    raise KilnError(f"cannot load {so}: {'; '.join(failures)}",
                    "check that the build is whole (recompile it) and that a temporary folder can hold it")


class CompiledModel:
    """A model.so and its weights: call it with the model's inputs, get its outputs."""

    def __init__(self, build_dir: Path, verify: bool = True, graphs: bool | None = None) -> None:
        import torch  # noqa: F401  (model.so needs libtorch loaded first)

        self.build_dir = build_dir
        manifest = read_manifest(build_dir)
        check_size(manifest, build_dir / MODEL_SO)  # before mapping it: a short file faults
        check_size(manifest, build_dir / WEIGHTS)
        if verify:
            check_weights_header(manifest, build_dir / WEIGHTS)
        self._lib = open_library(build_dir / MODEL_SO, manifest, verify)
        _declare(self._lib)
        version = self._lib.kiln_abi_version()
        if version != ABI_VERSION:
            raise KilnError(f"{build_dir / MODEL_SO} has ABI version {version}; kiln loads {ABI_VERSION}",
                            "recompile the model with this version of kiln")
        handle = ctypes.c_void_p()
        mode = graphs_mode(graphs)
        flags = (0 if verify else _CREATE_NO_VERIFY) | (0 if mode != "off" else _CREATE_NO_GRAPHS)
        weights = str(build_dir / WEIGHTS).encode()
        status = self._lib.kiln_model_create_with(weights, flags, ctypes.byref(handle))
        if status != 0:
            hint = "use the weights file written by the same compile (kiln compile MODEL)" \
                if status == _BAD_WEIGHTS else ""
            raise KilnError(f"cannot create the model from {build_dir / WEIGHTS}: {self._error()}", hint)
        self._handle = handle
        self._lock = threading.Lock()
        self.inputs = self._infos("input")
        self.outputs = self._infos("output")
        self.target = self._lib.kiln_model_target().decode()
        self._no_pool = ""  # why a cuda model that wants one has no pool hook
        self._pool = self._pool_hook() if mode == "all" and self.target == "cuda" else None
        self._out_spec = _out_spec(manifest.model.out_spec, len(self.outputs))

    @property
    def replay(self) -> str:
        """How a run launches its work: "off: why", or "on: ..." with the model's CUDA graphs and
        the calls that run directly (runtime/kiln_replay.h)."""
        if not hasattr(self._lib, "kiln_model_replay"):
            return "off: this model.so predates CUDA graphs (recompile it)"
        said = str(self._lib.kiln_model_replay(self._handle).decode())
        failure = self._pool.failure if self._pool is not None else self._no_pool
        return f"{said} (pool hook: {failure})" if failure and failure not in said else said

    def _pool_hook(self) -> cuda_pool.TorchPool | None:
        """The pool hook that lets the model's CUDA graphs hold its calls into torch too
        (kiln/cuda_pool.py), kept alive as long as the model."""
        if not hasattr(self._lib, "kiln_model_set_pool_hook"):
            return None
        self._no_pool = cuda_pool.usable()
        if self._no_pool:
            return None
        pool = cuda_pool.TorchPool()
        if self._lib.kiln_model_set_pool_hook(self._handle, pool.callback, None) != 0:
            raise KilnError(f"cannot set the model's pool hook: {self._error()}")
        return pool

    def _raise_interrupt(self) -> None:
        """A Ctrl-C that came while the pool hook ran (inside the C call, which had to go on) is
        raised now; the run's outputs go with it, as with an interrupt anywhere else in a call."""
        if self._pool is not None and self._pool.interrupted is not None:
            interrupted, self._pool.interrupted = self._pool.interrupted, None
            raise interrupted

    def _error(self) -> str:
        return str(self._lib.kiln_last_error().decode(errors="replace"))

    def _infos(self, side: str) -> tuple[TensorInfo, ...]:
        lib, h = self._lib, self._handle
        found = []
        for i in range(getattr(lib, f"kiln_model_num_{side}s")(h)):
            ndim = getattr(lib, f"kiln_model_{side}_ndim")(h, i)
            sizes = getattr(lib, f"kiln_model_{side}_sizes")(h, i)
            strides = getattr(lib, f"kiln_model_{side}_strides")(h, i)
            name = getattr(lib, f"kiln_model_{side}_name")(h, i).decode()
            dtype = getattr(lib, f"kiln_model_{side}_dtype")(h, i).decode()
            found.append(TensorInfo(name, tuple(sizes[:ndim]), tuple(strides[:ndim]), dtype))
        return tuple(found)

    def __call__(self, *args: Any) -> Any:
        import torch

        self._check(args)
        capsules = torch._C._aoti.unsafe_alloc_void_ptrs_from_tensors(list(args))
        handles = [_capsule_pointer(c, None) for c in capsules]
        ins = (ctypes.c_void_p * max(1, len(handles)))(*handles)
        outs = (ctypes.c_void_p * max(1, len(self.outputs)))()
        try:
            status = self._lib.kiln_model_run(self._handle, ins, len(handles), outs, len(self.outputs))
        finally:
            for h in handles:
                self._lib.aoti_torch_delete_tensor_object(h)
        if status != 0:
            message = self._error()
            self._raise_interrupt()
            raise (ModelInputError if status == _BAD_ARGUMENT else RuntimeError)(message)
        flat = torch._C._aoti.alloc_tensors_by_stealing_from_void_ptrs(
            [_capsule_new(outs[i], None, None) for i in range(len(self.outputs))])
        self._raise_interrupt()  # after the outputs are tensors: they are freed, not leaked
        return _unflatten(flat, self._out_spec)

    def _check(self, args: tuple[Any, ...]) -> None:
        """The checks that need Python's view (types); shapes and dtypes are checked in C."""
        import torch

        if len(args) != len(self.inputs):
            names = ", ".join(i.name for i in self.inputs)
            raise ModelInputError(f"the model takes {len(self.inputs)} inputs ({names}), got {len(args)}")
        for info, arg in zip(self.inputs, args, strict=True):
            if not isinstance(arg, torch.Tensor):
                raise ModelInputError(f"input '{info.name}' is a {type(arg).__name__}, not a torch.Tensor")

    def __del__(self) -> None:
        handle = getattr(self, "_handle", None)
        if handle is not None and handle.value:
            self._lib.kiln_model_destroy(handle)
            self._handle = ctypes.c_void_p()

    def __repr__(self) -> str:
        ins = ", ".join(f"{i.name}: {i.dtype}{list(i.shape)}" for i in self.inputs)
        return f"CompiledModel({self.build_dir}, target={self.target}, inputs=({ins}))"


def _out_spec(spec: Any, outputs: int) -> Any:
    """The output structure (a pytree spec), or None for a flat tuple of outputs."""
    if spec is None:
        return None
    from torch.utils import _pytree

    text = spec if isinstance(spec, str) else json.dumps(spec)
    try:
        register_named_in(text)  # torch.return_types results: namedtuples of kiln's
        tree = _pytree.treespec_loads(text)
    except Exception:  # a container type this process has not registered: fall back to flat
        return None
    return tree if tree.num_leaves == outputs else None


def _unflatten(flat: list[Any], spec: Any) -> Any:
    if spec is None:
        return flat[0] if len(flat) == 1 else tuple(flat)
    from torch.utils import _pytree

    return _pytree.tree_unflatten(flat, spec)


def graphs_mode(graphs: bool | None) -> str:
    """How a cuda model replays its runs: "all" (CUDA graphs of its kernels and its calls into
    torch), "kernels" (of its kernels; calls into torch run directly between them) or "off".
    `graphs` if given (True: "all"), else KILN_CUDA_GRAPHS ("0" off, "kernels"), else "all"."""
    if graphs is not None:
        return "all" if graphs else "off"
    said = os.environ.get("KILN_CUDA_GRAPHS", "1").strip().lower()
    if said in ("0", "false", "no", "off"):
        return "off"
    return "kernels" if said == "kernels" else "all"


def load(build_dir: Path | str, *, verify: bool = True, graphs: bool | None = None) -> CompiledModel:
    """The build in build_dir, checked against its model.json first: the sizes of model.so and
    the weights always, their digests unless verify=False (see pipeline/integrity.py). A cuda
    model's first run records its launches as CUDA graphs that later runs replay, unless
    graphs=False (or KILN_CUDA_GRAPHS=0; KILN_CUDA_GRAPHS=kernels leaves calls into torch out of
    them): see CompiledModel.replay."""
    path = Path(build_dir)
    if not (path / MODEL_SO).is_file():
        raise KilnError(f"{path} has no {MODEL_SO}", "compile the model first: kiln compile MODEL --out DIR")
    if not (path / WEIGHTS).is_file():
        raise KilnError(f"{path} has no {WEIGHTS}", "a build folder holds model.so and its weights file")
    return CompiledModel(path, verify, graphs)
