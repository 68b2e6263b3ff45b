"""Standalone GPU tuner for kiln's Triton kernels (copied as tune.py beside kernels.json).

    python tune.py [--kernels k3,k7] [--out tuning.json] [--cubins DIR] [--spec kernels.json]

For each kernel in kernels.json, in a worker process per visible GPU: make random inputs with
the kernel's exact shapes, strides and dtypes (integers read as indices stay in range) for that
kernel only, run the default candidate and time it; unless it is already near what the GPU's
memory allows (`settles`), run every other variant in every candidate config, reject any whose
outputs differ from the default's, time the rest and keep the fastest (--full: never settle);
free the inputs before the next kernel, so
peak memory is the largest single kernel's working set. A candidate that fails to compile, runs
out of resources or crashes scores infinity; a crash of the worker itself costs only that
kernel. It never runs the model. This file imports nothing from kiln.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

_TORCH_DTYPES = {"b8": "bool", "u8": "uint8", "i8": "int8", "i16": "int16", "i32": "int32", "i64": "int64",
                 "f16": "float16", "bf16": "bfloat16", "f32": "float32", "f64": "float64"}
_TOLERANCE = {"float16": 1e-2, "bfloat16": 2e-2}
_WORKER_TIMEOUT_S = 600
_MAX_PRECOMPILE = 12  # processes compiling candidates beside the tuning workers
_SLEEP_CYCLES = 200_000  # ~0.1 ms at GPU clocks: longer than the host needs to queue one launch
_SETTLE_SLACK_S, _SETTLE_SLACK = 2e-6, 0.15  # what the default may lose to its bound, and still ship
_PROBE_BYTES = 64 << 20  # the copy that measures bandwidth: beyond L2 (50 MB on an H100 or H200)
_DECIDED = "decided"  # a folder of empty files, one per kernel a worker has decided
_LIBRARY = "library"  # a matmul pair's candidate that runs the call and its kernel apart
_BLOCKS = ("XBLOCK", "RBLOCK", "KBLOCK", "GROUP_M")  # a config's constexprs (the template has all four)


def load_module(path: Path) -> ModuleType:
    # Note: no __pycache__ beside the module: it sits in a cache entry, which nobody may change.
    sys.dont_write_bytecode = True
    spec = importlib.util.spec_from_file_location(f"kiln_kernel_{path.stem}", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def random_inputs(params: list[dict[str, Any]], device: str, seed: int = 0) -> list[Any]:
    """Each parameter's tensor, its storage filled with random values, then viewed with the
    parameter's strides (a matmul's operand may be an expanded view: a stride of 0, which no
    copy into the view could fill)."""
    import torch

    gen = torch.Generator(device="cpu").manual_seed(seed)
    out = []
    for p in params:
        dtype = getattr(torch, _TORCH_DTYPES[p["dtype"]])
        shape, stride = p["shape"], p["stride"]
        span = 0 if 0 in shape else 1 + sum((n - 1) * s for n, s in zip(shape, stride, strict=True))
        if dtype.is_floating_point:
            flat = torch.randn(span, generator=gen)
        elif dtype == torch.bool:
            flat = torch.randint(0, 2, (span,), generator=gen).bool()
        else:
            flat = torch.randint(0, p.get("bound") or 5, (span,), generator=gen)
        out.append(flat.to(device=device, dtype=dtype).as_strided(shape, stride))
    return out


def grid_of(variant: dict[str, Any], config: dict[str, int]) -> tuple[int, int, int]:
    """One program per [XBLOCK, RBLOCK] tile of the variant's (rows, columns)."""
    rows, cols = variant["tile"]
    return (math.ceil(rows / config["XBLOCK"]) * math.ceil(cols / config["RBLOCK"]), 1, 1)


def matmul_grid(entry: dict[str, Any], config: dict[str, int]) -> tuple[int, int, int]:
    """The template's programs: every batch's tiles of the product, along the first axis."""
    batch, rows, cols, _ = entry["matmul"]["sizes"]
    return (batch * math.ceil(rows / config["XBLOCK"]) * math.ceil(cols / config["RBLOCK"]), 1, 1)


def launch(kernel: Any, entry: dict[str, Any], variant: dict[str, Any], tensors: list[Any],
           config: dict[str, int]) -> None:
    """Runs one compiled candidate (explicit_compile's) on the wrapper's arguments. Triton's
    launcher takes every parameter of the signature, the constexprs too (it skips them); a
    matmul template takes no xnumel or rnumel."""
    if "matmul" in entry:
        kernel[matmul_grid(entry, config)](*tensors, *(config[name] for name in _BLOCKS))
        return
    kernel[grid_of(variant, config)](*tensors, entry["xnumel"], entry["rnumel"], config["XBLOCK"],
                                     config["RBLOCK"])


def agrees(got: list[Any], want: list[Any]) -> bool:
    import torch

    for a, b in zip(got, want, strict=True):
        tol = _TOLERANCE.get(str(a.dtype).removeprefix("torch."), 1e-4)
        if not torch.allclose(a.double() if a.is_floating_point() else a.long(),
                              b.double() if b.is_floating_point() else b.long(), rtol=tol, atol=tol,
                              equal_nan=True):
            return False
    return True


def candidates(entry: dict[str, Any]) -> list[tuple[str, dict[str, Any], dict[str, int]]]:
    """(label, variant, config) for every variant and config; the default is first."""
    return [(f"{v['name']}:{i}", v, c) for v in entry["variants"] for i, c in enumerate(v["configs"])]


def tune_kernel(entry: dict[str, Any], folder: Path, cubins: Path | None,
                full: bool = False) -> dict[str, Any]:
    """Every candidate of one kernel on this process's GPU (`full`: even where the default
    settles it); the record of the winner."""
    import torch

    module = load_module(folder / entry["file"])
    outputs = [i for i, p in enumerate(entry["params"]) if p["role"] != "in"]
    roles = [p["role"] for p in entry["params"]]
    _device_limits()  # measured before the peak is reset: its buffers are freed by then
    torch.cuda.reset_peak_memory_stats()
    base = random_inputs(entry["params"], "cuda")
    inputs_bytes = sum(t.untyped_storage().nbytes() for t in base)
    bound = bound_seconds(base, roles, entry["xnumel"] * entry["rnumel"])
    timings: dict[str, float | None] = {}
    errors: dict[str, str] = {}
    reference: list[Any] | None = None
    compiled: dict[str, Any] = {}
    base = [None if role == "out" else t for t, role in zip(base, roles, strict=True)]
    tensors: list[Any] = []
    settled, default = False, labels(entry)[0]  # only the default settles: a rival is no default
    for label, variant, config in candidates(entry):
        if settled:
            break
        fn = getattr(module, variant["function"])
        tensors = []  # the last candidate's outputs go before this one's are made
        # Note: inputs are shared, outputs fresh per candidate, and the reference outputs wait
        # on the host: device memory stays at one kernel's inputs and outputs.
        tensors = [_fresh(p) if role == "out" else (t.clone() if role == "inout" else t)
                   for t, p, role in zip(base, entry["params"], roles, strict=True)]
        try:
            kernel = compile_here(entry, fn, config)
            launch(kernel, entry, variant, tensors, config)
            torch.cuda.synchronize()
        except Exception as err:  # out of resources, a compile error: this candidate only
            timings[label], errors[label] = None, f"{type(err).__name__}: {str(err)[:300]}"
            continue
        compiled[label] = kernel  # only a candidate that ran can be shipped
        result = [tensors[i].cpu() for i in outputs]
        if reference is None:
            reference = result
        elif not agrees(result, reference):
            timings[label], errors[label] = None, "outputs differ from the default candidate's"
            continue
        timings[label] = took = seconds(compiled[label], entry, variant, tensors, config)
        settled = label == default and not full and settles(took, bound)
    record = decide(entry, timings, errors)
    record |= {"inputs_bytes": inputs_bytes, "peak_bytes": torch.cuda.max_memory_allocated(),
               "gpu": torch.cuda.get_device_name(), "bound": bound, "settled": settled}
    if cubins is not None and record["label"] in compiled:
        # Note: the cubin shipped is the one timed: every candidate is compiled as the wrapper
        # launches it (explicit_compile), not by the JIT, which folds arguments and assumes
        # alignments from the tensors it saw.
        save_cubin(compiled[record["label"]], cubins / f"{entry['key'][:16]}")
    del base, tensors
    torch.cuda.empty_cache()
    return record


# Note: a matmul pair is tuned in full (a matmul is no memory-bound kernel: nothing settles it).
# Its template's candidates are checked against, and timed beside, the library's way: torch's
# call (cuBLAS) into a product buffer, then the epilogue kernel's default candidate on it. The
# epilogue's own tuning may later pick a faster candidate for it, which that time leaves out;
# the epilogue kernels of a model are mostly settled by their default.
def tune_matmul(entry: dict[str, Any], epilogue: dict[str, Any], folder: Path,
                cubins: Path | None) -> dict[str, Any]:
    """A matmul pair's candidates: the library's calls (where a candidate) and the template in
    each config; the record of the winner (its cubin: only a template's)."""
    import torch

    module = load_module(folder / entry["file"])
    roles = [p["role"] for p in entry["params"]]
    outputs = [i for i, role in enumerate(roles) if role != "in"]
    _device_limits()
    # Note: cuBLAS's workspace is allocated through torch's allocator at a process's first
    # matmul and kept; it is the library's, not the pair's working set, so it is made before
    # the peak is reset and counted out of it.
    torch.mm(torch.ones(1, 1, device="cuda"), torch.ones(1, 1, device="cuda"))
    held = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    base = random_inputs(entry["params"], "cuda")
    # the working set: the pair's tensors, and the product the library's way writes
    product = epilogue["params"][entry["matmul"]["product"]]
    inputs_bytes = sum(t.untyped_storage().nbytes() for t in base) + _fresh(product, "meta").nbytes
    base = [None if role == "out" else t for t, role in zip(base, roles, strict=True)]
    timings: dict[str, float | None] = {}
    errors: dict[str, str] = {}
    compiled: dict[str, Any] = {}
    tensors: list[Any] = []
    try:
        reference, library_s = _library_run(entry, epilogue, folder, base, outputs)
    except Exception as err:  # nothing to check the template against: no candidate ships
        reference, library_s = None, None
        errors[_LIBRARY] = f"{type(err).__name__}: {str(err)[:300]}"
    for label, variant, config in candidates(entry):
        if variant["name"] == _LIBRARY:
            timings[label] = library_s
            continue
        tensors = []  # the last candidate's outputs go before this one's are made
        tensors = [_fresh(p) if role == "out" else (t.clone() if role == "inout" else t)
                   for t, p, role in zip(base, entry["params"], roles, strict=True)]
        try:
            kernel = compile_here(entry, getattr(module, variant["function"]), config)
            launch(kernel, entry, variant, tensors, config)
            torch.cuda.synchronize()
        except Exception as err:  # out of resources, a compile error: this candidate only
            timings[label], errors[label] = None, f"{type(err).__name__}: {str(err)[:300]}"
            continue
        if reference is None or not agrees([tensors[i].cpu() for i in outputs], reference):
            timings[label], errors[label] = None, "outputs differ from the library's"
            continue
        compiled[label] = kernel
        timings[label] = seconds(kernel, entry, variant, tensors, config)
    record = decide(entry, timings, errors)
    record |= {"inputs_bytes": inputs_bytes, "peak_bytes": torch.cuda.max_memory_allocated() - held,
               "gpu": torch.cuda.get_device_name(), "settled": False}
    if cubins is not None and record["label"] in compiled:
        save_cubin(compiled[record["label"]], cubins / f"{entry['key'][:16]}")
    del base, tensors
    torch.cuda.empty_cache()
    return record


def _library_run(entry: dict[str, Any], epilogue: dict[str, Any], folder: Path, base: list[Any],
                 outputs: list[int]) -> tuple[list[Any], float]:
    """The pair as the build runs it without the template: the outputs (on the host) and the
    seconds of the call and the epilogue kernel's default candidate."""
    import torch

    facts = entry["matmul"]
    head = call_inputs(entry)
    product, rest, tensors = library_arguments(entry, epilogue, base)
    variant = epilogue["variants"][0]
    config = variant["configs"][0]
    fn = getattr(load_module(folder / epilogue["file"]), variant["function"])
    kernel = compile_here(epilogue, fn, config)

    def run() -> None:
        library_call(facts, base[0], base[1], base[2] if head == 3 else None, product)
        launch(kernel, epilogue, variant, tensors, config)

    run()
    torch.cuda.synchronize()
    return [rest[i - head].cpu() for i in outputs], _timed(run)


def call_inputs(entry: dict[str, Any]) -> int:
    """How many of a matmul pair's parameters are the call's inputs (a, b, and addmm's bias):
    they lead; the epilogue kernel's others follow in its order."""
    return 3 if entry["matmul"]["op"] in ("addmm", "baddbmm") else 2


def library_arguments(entry: dict[str, Any], epilogue: dict[str, Any],
                      base: list[Any]) -> tuple[Any, list[Any], list[Any]]:
    """The library's way on the pair's tensors `base` (None for an output): a fresh product,
    the pair's parameters after the call's inputs (outputs fresh, inouts cloned), and the
    epilogue kernel's arguments (those, with the product in its place)."""
    head, at = call_inputs(entry), entry["matmul"]["product"]
    device = base[0].device
    product = _fresh(epilogue["params"][at], device)
    rest = [_fresh(p, device) if p["role"] == "out" else (t.clone() if p["role"] == "inout" else t)
            for t, p in zip(base[head:], entry["params"][head:], strict=True)]
    return product, rest, [*rest[:at], product, *rest[at:]]


def library_call(facts: dict[str, Any], a: Any, b: Any, bias: Any, out: Any) -> None:
    """torch's matmul into `out`, as the wrapper's call runs it (kiln::mm, kiln::addmm, ...)."""
    import torch

    op, alpha, beta = facts["op"], facts["alpha"], facts["beta"]
    if op == "mm":
        torch.mm(a, b, out=out)
    elif op == "bmm":
        torch.bmm(a, b, out=out)
    elif op == "addmm":
        torch.addmm(bias, a, b, beta=beta, alpha=alpha, out=out)
    else:
        torch.baddbmm(bias, a, b, beta=beta, alpha=alpha, out=out)


# Note: most kernels of a real model are small, and tuning them cannot pay: measured on an H100,
# autotune was 85-90% of a torchvision compile, 2-4 s per kernel, for gains of at most 1.4x on
# kernels of a few microseconds. So the default candidate is timed first, against the kernel's
# bound: an empty launch plus its bytes (inputs read, outputs written) at the bandwidth of a
# device copy. A default within 15% or 2 us of that bound settles the kernel: no candidate can
# win more, as these kernels are memory-bound. A working set that fits in L2 can beat the bound;
# it settles too, as it runs in a few microseconds. Only kernels with room to win are tuned in
# full; `tune.py --full` tunes every kernel in full.
def settles(default_s: float, bound_s: float) -> bool:
    """Whether a default that takes `default_s` is close enough to `bound_s` to ship untried rivals."""
    return default_s <= bound_s + max(_SETTLE_SLACK_S, _SETTLE_SLACK * bound_s)


def bound_seconds(tensors: list[Any], roles: list[str], elements: int) -> float:
    """The least time a kernel moving these tensors can take on this GPU (see settles). A
    kernel of `elements` (x, r) points touches at most that many elements of each tensor: a
    gather from a large table reads a few rows of it, not the whole storage."""
    moved: int = sum(min(t.untyped_storage().nbytes(), elements * t.element_size())
                     * (2 if role == "inout" else 1) for t, role in zip(tensors, roles, strict=True))
    floor, bandwidth = _device_limits()
    return floor + moved / bandwidth


@functools.cache
def _device_limits() -> tuple[float, float]:
    """(seconds of an empty launch, bytes per second of a device copy), measured once per
    process the way candidates are timed, so a bound and a candidate's time compare."""
    import torch

    floor = _timed(torch.empty(1, device="cuda").zero_)
    copy = _copy_seconds()
    torch.cuda.empty_cache()  # the probe's buffers, freed by now
    return floor, 2 * _PROBE_BYTES / max(copy - floor, 1e-9)


def _copy_seconds() -> float:
    import torch

    src = torch.empty(_PROBE_BYTES, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return _timed(lambda: dst.copy_(src))


def _fresh(param: dict[str, Any], device: Any = "cuda") -> Any:
    import torch

    dtype = getattr(torch, _TORCH_DTYPES[param["dtype"]])
    return torch.empty_strided(param["shape"], param["stride"], dtype=dtype, device=device)


def seconds(kernel: Any, entry: dict[str, Any], variant: dict[str, Any], tensors: list[Any],
            config: dict[str, int], repeat: int = 50) -> float:
    """Median GPU seconds of one launch, by CUDA events.

    Note: each timed launch waits behind a short sleep kernel, so it is already queued when its
    start event is reached: the events bracket the kernel alone, not the ~20-30 us the host
    spends preparing a Triton launch (which would otherwise swamp any kernel of a few MB). No
    cache-flush buffer is used, so tuning's peak memory stays the kernel's own working set.
    """
    return _timed(lambda: launch(kernel, entry, variant, tensors, config), repeat)


def _timed(call: Callable[[], Any], repeat: int = 50) -> float:
    """Median GPU seconds of `call`'s launches (see seconds)."""
    import statistics

    import torch

    for _ in range(3):
        call()
    pairs = []
    for _ in range(repeat):
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        torch.cuda._sleep(_SLEEP_CYCLES)  # type: ignore[no-untyped-call]
        start.record()
        call()
        end.record()
        pairs.append((start, end))
    torch.cuda.synchronize()
    return float(statistics.median(start.elapsed_time(end) / 1e3 for start, end in pairs))


def labels(entry: dict[str, Any]) -> list[str]:
    """The labels decide() chooses among: each variant under each of its configs, the default first."""
    return [label for label, _, _ in candidates(entry)]


def decide(entry: dict[str, Any], timings: dict[str, float | None],
            errors: dict[str, str]) -> dict[str, Any]:
    names = labels(entry)
    default = names[0]
    scored = {label: timings.get(label) or math.inf for label in names}
    best = min(names, key=lambda label: (scored[label], label != default))
    _, chosen, config = next(c for c in candidates(entry) if c[0] == best)
    variant, function = chosen["name"], chosen["function"]
    gain = scored[default] / scored[best] if scored[best] not in (0, math.inf) else None
    return {"key": entry["key"], "label": best, "variant": variant, "function": function, "config": config,
            "default": default, "timings": timings, "errors": errors, "gain": gain,
            "tuned": scored[best] != math.inf}


def save_cubin(kernel: Any, stem: Path) -> None:
    """A compiled kernel's cubin and the launch facts the wrapper needs."""
    meta = kernel.metadata
    stem.with_suffix(".cubin").write_bytes(kernel.asm["cubin"])
    facts = {"name": meta.name, "num_warps": meta.num_warps, "shared": meta.shared,
             "global_scratch_size": getattr(meta, "global_scratch_size", 0),
             "profile_scratch_size": getattr(meta, "profile_scratch_size", 0),
             "folded": _folded_arguments(kernel)}
    stem.with_suffix(".json").write_text(json.dumps(facts, indent=1, sort_keys=True) + "\n")


def _folded_arguments(kernel: Any) -> list[str]:
    """Arguments the compile made constants: the cubin does not take them, so the wrapper must
    not pass them. explicit_compile folds none (the JIT's compile folded an int equal to 1, a
    pointwise kernel's rnumel, say); the record stays so the wrapper's contract is explicit."""
    src = getattr(kernel, "src", None)
    fn = getattr(src, "fn", None)
    names = list(getattr(fn, "arg_names", []))
    paths = [path for path in getattr(src, "constants", {})
             if isinstance(path, tuple) and len(path) == 1 and isinstance(path[0], int)
             and path[0] < len(names)]
    folded = [names[path[0]] for path in paths]
    return sorted(name for name in folded if name not in _BLOCKS)


def compile_attrs(entry: dict[str, Any], arg_names: list[str]) -> dict[tuple[int, ...], list[list[Any]]]:
    """The specialization every cubin is compiled with, which the wrapper guarantees: each
    pointer 16-byte aligned, and xnumel / rnumel marked divisible by 16 where they are.
    Keys are argument positions (arg_names: the kernel's parameters in order)."""
    values = {"xnumel": entry["xnumel"], "rnumel": entry["rnumel"]}
    unaligned = set(entry.get("matmul", {}).get("unaligned", ()))  # views at an offset: see MatmulFacts
    attrs: dict[tuple[int, ...], list[list[Any]]] = {}
    for name, kind in entry["signature"].items():
        if name in unaligned:
            continue
        if kind.startswith("*") or (name in values and values[name] % 16 == 0):
            attrs[(arg_names.index(name),)] = [["tt.divisibility", 16]]
    return attrs


def compile_cubin(entry: dict[str, Any], folder: Path, function: str, config: dict[str, int], arch: int,
                  stem: Path) -> None:
    """One candidate compiled for an arch (no GPU needed), as the wrapper launches it: every
    argument of the signature kept (none specialized away), alignment as compile_attrs says.

    Note: the JIT's own compile of a candidate may drop an argument equal to 1 or assume an
    alignment the wrapper cannot promise; the untuned path ships this compile.
    """
    fn = getattr(load_module(folder / entry["file"]), function)
    save_cubin(explicit_compile(entry, fn, config, arch), stem)


def explicit_compile(entry: dict[str, Any], fn: Any, config: dict[str, int], arch: int) -> Any:
    """triton.compile of one candidate with the wrapper's specialization (compile_attrs)."""
    import triton
    from triton.backends.compiler import GPUTarget

    constexprs = {name: config[name] for name in _BLOCKS if name in config}
    # Note: in the function's argument order (kernels.json keeps its keys sorted): triton's
    # launcher takes its arguments in the signature's order, the cubin in the function's.
    signature = {name: entry["signature"][name] for name in fn.arg_names if name in entry["signature"]}
    source = triton.compiler.ASTSource(fn=fn, signature=signature, constexprs=constexprs,
                                       attrs=compile_attrs(entry, list(fn.arg_names)))
    # Note: FP fusion (a*b+c as one FMA) is pinned, not left to triton's default: triton 3.9
    # warns that its default turns off in 3.10, which would change kiln's cubins and their
    # rounding with no change of kiln's. On is what every GPU test and benchmark has run. The
    # variable that would still force it off (and is in no cache key) is dropped: this runs in
    # kiln's own compile and tuning processes.
    os.environ.pop("TRITON_FORCE_DISABLE_FP_FUSION", None)
    options = {"num_warps": config["num_warps"], "num_stages": config["num_stages"], "enable_fp_fusion": True}
    return triton.compile(source, target=GPUTarget("cuda", arch, 32), options=options)


def compile_here(entry: dict[str, Any], fn: Any, config: dict[str, int]) -> Any:
    """explicit_compile for this process's GPU (from triton's cache when precompiled)."""
    import torch

    major, minor = torch.cuda.get_device_capability()
    kernel = explicit_compile(entry, fn, config, major * 10 + minor)
    meta = kernel.metadata
    if getattr(meta, "global_scratch_size", 0) or getattr(meta, "profile_scratch_size", 0):
        # kiln's launcher passes no scratch memory (tasks/targets/cuda/launch.py): not a candidate
        raise RuntimeError("the compiled kernel needs Triton scratch memory, which kiln's launcher lacks")
    return kernel


def _precompile_worker(args: argparse.Namespace) -> int:
    """Compiles the candidates listed (key:label,...) into triton's cache, as tuning will
    compile them; needs no GPU. A candidate that fails is left to tuning, which records why."""
    if args.arch is None:
        print("--precompile needs --arch (90 for an H200)", file=sys.stderr)
        return 2
    spec = json.loads(args.spec.read_text())
    folder = args.spec.parent / spec["folder"]
    entries = {e["key"]: e for e in spec["kernels"]}
    modules: dict[str, ModuleType] = {}
    for job in args.precompile.split(","):
        key, label = job.split(":", 1)
        if args.decided is not None and (args.decided / key).exists():  # tuned, or settled
            continue
        entry = entries[key]
        _, variant, config = next(c for c in candidates(entry) if c[0] == label)
        try:
            if key not in modules:
                modules[key] = load_module(folder / entry["file"])
            explicit_compile(entry, getattr(modules[key], variant["function"]), config, args.arch)
        except Exception as err:  # out of resources, a compile error: tuning says so
            print(f"{key[:16]} {label}: {type(err).__name__}: {str(err)[:200]}", file=sys.stderr)
    return 0


# Note: compiling candidates is most of a cold tune, and one process per GPU compiles them one
# at a time. So, beside the tuning workers, the candidates are compiled into triton's cache by a
# process per spare core: every kernel's default first, then the other candidates, each last
# kernel first, skipping a kernel the workers have decided (most settle on their default). Each
# tuning worker then finds its candidates compiled (or compiles the first few itself). The
# compile is the same explicit_compile tuning does, so each candidate is compiled once.
def start_precompile(kernels: Path, keys: list[str], gpus: int, arch: int,
                     tmp: Path) -> list[subprocess.Popen[bytes]]:
    spec = json.loads(kernels.read_text())
    entries = {e["key"]: e for e in spec["kernels"]}
    ranked = [(i > 0, f"{key}:{label}") for key in reversed(keys)
              for i, label in enumerate(label for label, variant, _ in candidates(entries[key])
                                        if variant["function"])]  # not a matmul pair's library calls
    jobs = [job for _, job in sorted(ranked, key=lambda r: r[0])]  # stable: defaults, then the rest
    count = min(len(jobs), max(0, len(os.sched_getaffinity(0)) - gpus), _MAX_PRECOMPILE)
    procs = []
    for i in range(count):
        cmd = [sys.executable, __file__, "--spec", str(kernels), "--arch", str(arch),
               "--decided", str(tmp / _DECIDED), "--precompile", ",".join(jobs[i::count])]
        with (tmp / f"precompile{i}.err").open("w") as err:
            procs.append(subprocess.Popen(cmd, stderr=err, stdout=subprocess.DEVNULL))
    return procs


def _worker(args: argparse.Namespace) -> int:
    """Tunes the listed kernels in order, appending one JSON line per finished kernel."""
    spec = json.loads(args.spec.read_text())
    folder = args.spec.parent / spec["folder"]
    entries = {e["key"]: e for e in spec["kernels"]}
    with args.out.open("a") as out:
        for key in args.worker.split(","):
            entry = entries[key]
            if "matmul" in entry:
                try:
                    record = tune_matmul(entry, entries[entry["matmul"]["epilogue"]], folder, args.cubins)
                except Exception as err:  # nothing shipped but the default (auto: the library's calls)
                    record = decide(entry, {}, {"tuning": f"{type(err).__name__}: {str(err)[:300]}"})
            else:
                record = tune_kernel(entry, folder, args.cubins, args.full)
            out.write(json.dumps(record, sort_keys=True) + "\n")
            out.flush()
            if args.decided is not None:
                (args.decided / key).touch()  # precompiles skip its candidates from now on
    return 0


def tune_all(kernels: Path, keys: list[str], cubins: Path | None, gpus: int,
             on_progress: Callable[[int, int], None] | None = None, full: bool = False) -> dict[str, Any]:
    """Tunes `keys` with one worker process per GPU. A worker that dies costs only the kernel
    it was on (recorded as failed); a new worker takes the rest of its list. on_progress hears
    (kernels done, kernels in all) as workers finish kernels."""
    records: dict[str, Any] = {}
    queues = [keys[g::max(1, gpus)] for g in range(max(1, gpus))]
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / _DECIDED).mkdir()
        arch = _arch()
        warming = [] if arch is None else start_precompile(kernels, keys, max(1, gpus), arch, Path(tmp))
        workers: list[_Worker] = []
        try:
            while any(queues):
                workers = [_Worker(kernels, device, queue, Path(tmp), cubins, full)
                           for device, queue in enumerate(queues) if queue]
                while any(w.running() for w in workers):
                    if on_progress is not None:
                        on_progress(len(records) + sum(len(w.done()) for w in workers), len(keys))
                for w in workers:
                    _collect(w, records, queues)
        finally:  # precompiles are done by now or compiling what nobody needs; on an error, all
            _stop([*warming, *(w.proc for w in workers)])
    if on_progress is not None:
        on_progress(len(records), len(keys))
    return records


def _collect(w: _Worker, records: dict[str, Any], queues: list[list[str]]) -> None:
    """A finished worker's records; the kernel it died on (if it did) fails, the rest go on."""
    done = w.done()
    records.update((r["key"], r) for r in done)
    rest = w.queue[len(done):]
    if rest:
        failed, rest = rest[0], rest[1:]
        records[failed] = {"key": failed, "tuned": False, "errors": {"worker": w.why()}}
    queues[w.device] = rest


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    """Ends processes politely (triton then cleans up its partial cache files), then firmly."""
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _arch() -> int | None:
    """The compute capability of the first GPU this process may use, as triton names it (90 on
    an H200), from nvidia-smi; None where nvidia-smi cannot say (then nothing is precompiled).

    Note: not through torch.cuda: this process only starts workers, and CUDA initialised in it
    would make the kiln process that runs autotune unsafe to fork.
    """
    try:
        query = ["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader", "-i", _physical_gpu(0)]
        proc = subprocess.run(query, capture_output=True, text=True, timeout=30, check=True)
        major, minor = proc.stdout.strip().splitlines()[0].split(".")
        return int(major) * 10 + int(minor)
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def _physical_gpu(index: int) -> str:
    """The GPU behind visible index `index`, under this process's CUDA_VISIBLE_DEVICES."""
    visible = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    return visible[index] if index < len(visible) else str(index)


class _Worker:
    """One tuning process on one GPU, working through its queue of kernels."""

    def __init__(self, kernels: Path, device: int, queue: list[str], tmp: Path, cubins: Path | None,
                 full: bool) -> None:
        self.device, self.queue = device, queue
        self.out, self.err = tmp / f"gpu{device}.jsonl", tmp / f"gpu{device}.err"
        self.out.write_text("")
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=_physical_gpu(device))
        cmd = [sys.executable, __file__, "--spec", str(kernels), "--worker", ",".join(queue),
               "--out", str(self.out), "--decided", str(tmp / _DECIDED),
               *(["--cubins", str(cubins)] if cubins else []), *(["--full"] if full else [])]
        with self.err.open("w") as err:
            self.proc = subprocess.Popen(cmd, env=env, stderr=err, stdout=subprocess.DEVNULL)
        self.deadline = time.monotonic() + _WORKER_TIMEOUT_S * len(queue)
        self.timed_out = False

    def running(self) -> bool:
        try:
            self.proc.wait(timeout=0.2)
        except subprocess.TimeoutExpired:
            if time.monotonic() < self.deadline:
                return True
            self.proc.kill()
            self.proc.wait()
            self.timed_out = True
        return False

    def done(self) -> list[dict[str, Any]]:
        whole = self.out.read_text().split("\n")[:-1]  # a line still being written has no newline
        return [json.loads(line) for line in whole if line.strip()]

    def why(self) -> str:
        if self.timed_out:
            return "timed out"
        return (self.err.read_text(errors="replace") or f"exit status {self.proc.returncode}")[-500:]


def main(argv: list[str] | None = None) -> int:
    here = Path(__file__).resolve().parent
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--kernels",
                        help="comma-separated kernels to tune (k3,k7 or full names); default all")
    parser.add_argument("--spec", type=Path, default=here / "kernels.json", help="the kernels.json to read")
    parser.add_argument("--out", type=Path, default=here / "tuning.json")
    parser.add_argument("--cubins", type=Path, help="write each winner's cubin and launch facts here")
    parser.add_argument("--full", action="store_true",
                        help="time every candidate of every kernel, even where the default settles it")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--precompile", help=argparse.SUPPRESS)
    parser.add_argument("--arch", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--decided", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return _worker(args)
    if args.precompile:
        return _precompile_worker(args)
    import torch

    if not torch.cuda.is_available():
        print("tune.py needs a CUDA GPU", file=sys.stderr)
        return 2
    spec = json.loads(args.spec.read_text())
    only = set(args.kernels.split(",")) if args.kernels else None
    keys = [e["key"] for e in spec["kernels"] if only is None or only & {*e["names"], e["kernel"]}]
    if args.cubins:
        args.cubins.mkdir(parents=True, exist_ok=True)
    if only is not None and not keys:
        print(f"tune.py: no kernel is named {args.kernels}; kernels.json lists them", file=sys.stderr)
        return 2
    records = tune_all(args.spec, keys, args.cubins, torch.cuda.device_count(), full=args.full)
    args.out.write_text(json.dumps(records, indent=1, sort_keys=True) + "\n")
    for entry in spec["kernels"]:
        r = records.get(entry["key"])
        if r is not None:
            gain = r.get("gain") or 0
            print(f"{entry['kernel']:>32} {r.get('label', '-'):>14} gain {gain:.2f}x", file=sys.stderr)
    return 0


if __name__ == "__main__":
    # Note: the autotune stage waits for this process's exit, and each tuning worker's exit is
    # waited for here; tearing down a Python that imported torch and triton and made a CUDA
    # context takes a second or more. Every result is written and closed by now (a worker's
    # lines are flushed as each kernel ends, cubins as each is saved), so it ends at once.
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
