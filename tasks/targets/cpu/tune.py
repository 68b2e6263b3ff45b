"""Standalone CPU tuner for kiln kernels (copied as tune.py beside kernels.json and kernels/).

    python tune.py [--kernel KEY] [--repeat N] [--out tuning.json]

For each kernel in kernels.json: build every variant with the host C++ compiler, run each on
the same random inputs (the right shapes, strides and dtypes; integers read as indices stay in
range), check its outputs against the default variant's, and time it. A variant that fails to
build, crashes or disagrees scores infinity; it never fails the run. It never runs the model.
This file imports nothing from kiln: it runs by hand on any machine with torch and g++.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

_DTYPES = {"b8": torch.bool, "u8": torch.uint8, "i8": torch.int8, "i16": torch.int16, "i32": torch.int32,
           "i64": torch.int64, "f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32,
           "f64": torch.float64}


def random_inputs(params: list[dict[str, Any]], seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    out = []
    for p in params:
        dtype = _DTYPES[p["dtype"]]
        t = torch.empty_strided(p["shape"], p["stride"], dtype=dtype)
        if dtype.is_floating_point:
            t.copy_(torch.randn(t.shape, generator=gen))
        elif dtype == torch.bool:
            t.copy_(torch.randint(0, 2, t.shape, generator=gen).bool())
        else:
            t.copy_(torch.randint(0, p.get("bound") or 5, t.shape, generator=gen))
        out.append(t)
    return out


def build(source: Path, out: Path, compiler: list[str], include: Path) -> str | None:
    """Compiles `source` (under `include`) to out.o, then links out; the build error, or None.

    Note: the compile runs in `include` on a relative path, so the object names no absolute
    path: it is byte-identical wherever the kernels folder lives, and is what the model links.
    """
    flags = [f for f in compiler[1:] if f != "-shared"]
    obj = out.with_suffix(".o")
    steps = [[compiler[0], *flags, "-I.", "-c", str(source.relative_to(include)), "-o", str(obj)],
             [compiler[0], "-shared", *(f for f in flags if f == "-fopenmp"), str(obj), "-o", str(out)]]
    for cmd in steps:
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=include)
        if proc.returncode != 0:  # a compiler that fails without a word still fails
            return proc.stderr[-2000:].strip() or f"{cmd[0]} exited with status {proc.returncode}"
    return None


def run_variant(lib_path: Path, function: str, tensors: list[torch.Tensor], repeat: int) -> float:
    """Median seconds of one call, after a warm-up call."""
    fn = getattr(ctypes.CDLL(str(lib_path)), function)
    args = [ctypes.c_void_p(t.data_ptr()) for t in tensors]
    fn(*args)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def agrees(got: list[torch.Tensor], want: list[torch.Tensor]) -> bool:
    for a, b in zip(got, want, strict=True):
        tol = 1e-2 if a.dtype in (torch.float16, torch.bfloat16) else 1e-4
        if not torch.allclose(a.double() if a.is_floating_point() else a.long(),
                              b.double() if b.is_floating_point() else b.long(),
                              rtol=tol, atol=tol, equal_nan=True):
            return False
    return True


Built = dict[str, "Path | str"]  # variant -> its library, or the build error


def build_variants(entries: list[dict[str, Any]], folder: Path, compiler: list[str], into: Path,
                   jobs: int | None = None) -> dict[str, Built]:
    """Every variant of every kernel built, in parallel (compiles are independent; timing is not)."""
    tasks = [(e["key"], v["name"], folder / v["file"], into / f"{e['key'][:16]}_{v['name']}.so")
             for e in entries for v in e["variants"]]
    with ThreadPoolExecutor(max_workers=jobs or os.cpu_count() or 1) as pool:
        errors = list(pool.map(lambda t: build(t[2], t[3], compiler, folder), tasks))
    built: dict[str, Built] = {e["key"]: {} for e in entries}
    for (key, name, _, lib), error in zip(tasks, errors, strict=True):
        built[key][name] = lib if error is None else f"build failed: {error.strip().splitlines()[-1]}"
    return built


def tune_kernel(entry: dict[str, Any], folder: Path, compiler: list[str], repeat: int,
                built: Built | None = None) -> dict[str, Any]:
    """Every variant of one kernel, timed and checked; the record of the winner."""
    with tempfile.TemporaryDirectory() as tmp:
        if built is None:
            built = build_variants([entry], folder, compiler, Path(tmp))[entry["key"]]
        return _time_variants(entry, built, repeat)


def _time_variants(entry: dict[str, Any], built: Built, repeat: int) -> dict[str, Any]:
    outputs = [i for i, p in enumerate(entry["params"]) if p["role"] != "in"]
    base = random_inputs(entry["params"])
    timings: dict[str, float | None] = {}
    errors: dict[str, str] = {}
    reference: list[torch.Tensor] | None = None
    for variant in entry["variants"]:
        name, lib = variant["name"], built[variant["name"]]
        if isinstance(lib, str):
            timings[name], errors[name] = None, lib
            continue
        tensors = [t.clone() for t in base]
        try:
            seconds = run_variant(lib, entry["function"], tensors, repeat)
        except OSError as err:
            timings[name], errors[name] = None, f"load failed: {err}"
            continue
        result = [tensors[i] for i in outputs]
        if reference is None:
            reference = result
        elif not agrees(result, reference):
            timings[name], errors[name] = None, "outputs differ from the default variant's"
            continue
        timings[name] = seconds
    return decide(entry, timings, errors)


def labels(entry: dict[str, Any]) -> list[str]:
    """The names decide() chooses among: the kernel's variants, the default first."""
    return [v["name"] for v in entry["variants"]]


def decide(entry: dict[str, Any], timings: dict[str, float | None],
            errors: dict[str, str]) -> dict[str, Any]:
    default = entry["variants"][0]["name"]
    scored = {n: (t if t is not None else math.inf) for n, t in timings.items()}
    best = min(scored, key=lambda n: (scored[n], n != default))
    if scored[best] == math.inf:
        best = default
    config = next(v["config"] for v in entry["variants"] if v["name"] == best)
    gain = (scored[default] / scored[best]) if scored[best] not in (0, math.inf) else None
    return {"key": entry["key"], "variant": best, "config": config, "default": default,
            "timings": timings, "errors": errors, "gain": gain, "tuned": True}


def main(argv: list[str] | None = None) -> int:
    here = Path(__file__).resolve().parent
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", type=Path, default=here / "kernels.json")
    parser.add_argument("--kernel", help="tune only this kernel key")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--out", type=Path, default=here / "tuning.json")
    args = parser.parse_args(argv)
    spec = json.loads(args.kernels.read_text())
    cxx = shutil.which(spec["compiler"][0]) or spec["compiler"][0]
    compiler = [cxx, *spec["compiler"][1:]]
    folder = args.kernels.parent / spec["folder"]
    records = {}
    for entry in spec["kernels"]:
        if args.kernel and entry["key"] != args.kernel:
            continue
        records[entry["key"]] = tune_kernel(entry, folder, compiler, args.repeat)
        r = records[entry["key"]]
        print(f"{entry['names'][0]:>8} {r['variant']:>16} gain {r['gain'] or 0:.2f}x", file=sys.stderr)
    args.out.write_text(json.dumps(records, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    # Note: the autotune stage waits for this process's exit, and tearing down a Python that
    # imported torch takes a while (0.4 s on a CPU machine); the results file is written and
    # closed by now, so it ends at once.
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
