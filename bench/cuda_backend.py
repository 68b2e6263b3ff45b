"""CUDA backend benchmark (not a timed test; needs a GPU): `python3 bench/cuda_backend.py [MODEL ...]`.

Usage: python3 bench/cuda_backend.py [MODEL ...] [--runs N] [--aoti-all] [--json PATH]

For each model (default: bert gpt2 resnet18 mlp), in one run on one GPU:
  kiln           cold compile (`python -m pipeline compile MODEL --target cuda`, fresh kiln and
                 triton caches), a no-op recompile on the same caches, the link stage's seconds
                 from report.json, the peak GPU memory of the autotune stage (the largest
                 peak_bytes of timings.json, next to the largest kernel's inputs_bytes, and the
                 peak in the autotune row's note) against the model's weight bytes (the tensors
                 of weights.safetensors: a peak far below them shows they never reached the
                 GPU), then latency of `pipeline.loader.load(out)`;
  AOTInductor    export + aoti_compile_and_package with model and inputs on the GPU. For bert
                 (every model with --aoti-all) this runs on fresh inductor and triton caches and
                 a fresh TMPDIR, and is the cold compile time; for the others it runs on caches
                 shared by the whole run, only to get a package, and its time is not shown as
                 cold. Then latency of the package loaded with aoti_load_package;
  torch.compile  latency of torch.compile(model) (default mode) after its first, compiling call;
  eager          latency of the module on the GPU under torch.no_grad().
Every backend runs the same module (the kiln build's weights, via pipeline.run_model.eager_model)
on the same random inputs; each latency is the median of --runs calls after --warmup calls, with
torch.cuda.synchronize() before and after each timed call, plus the max abs error against eager.
Every compile and every latency measurement runs in its own process (this file with --worker),
so nothing is warm and a crash in one backend costs only that measurement; a failing backend is
recorded as an error string and the run goes on. The targets at the end are PASS/MISS lines,
not assertions. Results go to --json (default build/bench-cuda-backend.json).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.report_table import ERROR_CHARS, Columns, cell, pick, ratio, table, tail  # noqa: E402

DEFAULT_MODELS = ("bert", "gpt2", "resnet18", "mlp")
COLD_AOTI_MODELS = ("bert",)  # the models that get a cold AOTI compile without --aoti-all
_MB = 2**20

# Note: both cold-compile figures are the wall time of a whole fresh process (python start,
# torch import, building the model, export, compile), as in bench/cpu_backend.py; the AOTI
# worker also reports export_s and compile_s measured inside the process.


# ---- the parent: runs workers and the kiln CLI, collects results ----


# Note: inductor keeps its triton kernels under TORCHINDUCTOR_CACHE_DIR unless TRITON_CACHE_DIR
# is set, and kiln's autotune uses triton's own cache (~/.triton by default): each compile gets
# its own folder for both, so "cold" means cold for both compilers.
def worker_env(tmp: Path, name: str) -> dict[str, str]:
    """The environment of a child process whose caches and TMPDIR all live in tmp/name."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    folder = tmp / name
    (folder / "tmp").mkdir(parents=True, exist_ok=True)  # tempfile ignores a TMPDIR that does not exist
    return dict(os.environ, PYTHONPATH=path, TMPDIR=str(folder / "tmp"),
                TORCHINDUCTOR_CACHE_DIR=str(folder / "inductor"), TRITON_CACHE_DIR=str(folder / "triton"))


def run_worker(spec: dict[str, Any], env: dict[str, str], timeout: float) -> dict[str, Any]:
    """Run one --worker job in a fresh process; its result, plus process_s, or an error."""
    result = Path(spec["result"])
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(spec)]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True,
                              timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    seconds = time.perf_counter() - t0
    if proc.returncode != 0 or not result.is_file():
        return {"error": f"worker exited {proc.returncode}: {tail(proc.stderr + proc.stdout)}",
                "process_s": round(seconds, 3)}
    found: dict[str, Any] = json.loads(result.read_text())
    found["process_s"] = round(seconds, 3)
    return found


def kiln_cli(model: str, tmp: Path, opts: argparse.Namespace) -> tuple[float, dict[str, Any]]:
    """One `kiln compile --target cuda` into tmp/kiln-out on the cache in tmp/kiln: seconds, report."""
    env = dict(worker_env(tmp, "kiln"), KILN_CACHE_DIR=str(tmp / "kiln" / "cache"))
    cmd = [sys.executable, "-m", "pipeline", "compile", model, "--quiet", "--target", "cuda",
           "--out", str(tmp / "kiln-out")]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=opts.timeout, check=False)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"kiln compile exited {proc.returncode}: {tail(proc.stderr + proc.stdout)}")
    return seconds, json.loads((tmp / "kiln-out" / "report.json").read_text())


def stage_rows(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {row["stage"]: row for row in report.get("stages", [])}


def link_row(report: dict[str, Any]) -> dict[str, Any]:
    row = stage_rows(report).get("link", {})
    ran = row.get("status") == "ran"
    return {"link_s": row.get("seconds") if ran else None, "link_status": row.get("status"),
            "link_note": row.get("note")}


def stage_seconds(report: dict[str, Any]) -> dict[str, float]:
    return {name: row["seconds"] for name, row in stage_rows(report).items() if row.get("status") == "ran"}


_KILN_ERRORS = (RuntimeError, OSError, ValueError, KeyError, subprocess.TimeoutExpired)


def kiln_compiles(model: str, tmp: Path, opts: argparse.Namespace) -> dict[str, Any]:
    """The cold compile (with its memory), then a no-op recompile on the same cache and folder."""
    try:
        cold_s, report = kiln_cli(model, tmp, opts)
    except _KILN_ERRORS as err:
        return {"error": f"{type(err).__name__}: {err}"[-ERROR_CHARS:]}
    found: dict[str, Any] = {"cold": {"process_s": round(cold_s, 3), **link_row(report),
                                      "stages": stage_seconds(report)}}
    found["memory"] = compile_memory(tmp / "kiln-out", report)
    try:
        noop_s, again = kiln_cli(model, tmp, opts)
    except _KILN_ERRORS as err:
        found["recompile"] = {"error": f"{type(err).__name__}: {err}"[-ERROR_CHARS:]}
        return found
    statuses = {name: row["status"] for name, row in stage_rows(again).items()}
    found["recompile"] = {"process_s": round(noop_s, 3), "stages": statuses}
    return found


def compile_memory(out: Path, report: dict[str, Any]) -> dict[str, Any]:
    """The autotune stage's GPU memory (timings.json and its report note) and the weights' bytes."""
    try:
        records: dict[str, Any] = json.loads((out / "timings.json").read_text())
        weights = weight_bytes(out / "weights.safetensors")
    except (OSError, ValueError, KeyError) as err:
        return {"error": f"{type(err).__name__}: {err}"[-ERROR_CHARS:]}
    peak = largest_of(records, "peak_bytes")
    largest = largest_of(records, "inputs_bytes")
    note = str(stage_rows(report).get("autotune", {}).get("note") or "")
    noted = re.search(r"peak ([\d.]+) MB", note)
    return {"peak_bytes": peak, "peak_mb": mb(peak), "largest_inputs_bytes": largest,
            "peak_over_largest": ratio(peak, largest), "kernels": len(records),
            "note_peak_mb": float(noted.group(1)) if noted else None, "autotune_note": note,
            "weight_bytes": weights, "weight_mb": mb(weights)}


def largest_of(records: dict[str, Any], field: str) -> int | None:
    """The largest value of a field over timings.json's records; None where no record has it (a
    compile without a GPU writes untuned records)."""
    values = [r[field] for r in records.values() if isinstance(r.get(field), int)]
    return max(values, default=None)


def weight_bytes(path: Path) -> int:
    """The bytes of every tensor in a safetensors file, from its header (8-byte length, JSON)."""
    with path.open("rb") as f:
        size = int.from_bytes(f.read(8), "little")
        header: dict[str, Any] = json.loads(f.read(size))
    spans = [entry["data_offsets"] for name, entry in header.items() if name != "__metadata__"]
    return sum(end - start for start, end in spans)


def aoti_compile_run(model: str, tmp: Path, opts: argparse.Namespace, shared: Path) -> dict[str, Any]:
    """AOTI's compile of one model: cold (own caches) for COLD_AOTI_MODELS or --aoti-all, else
    on the caches shared by the whole run. {"cold": ...} or {"shared_cache": ...}."""
    cold = opts.aoti_all or model in COLD_AOTI_MODELS
    env = worker_env(tmp, "aoti-cold") if cold else worker_env(shared, "aoti-shared")
    spec = {"task": "aoti-compile", "model": model, "build": str(tmp / "kiln-out"),
            "package": str(tmp / "aoti.pt2"), "result": str(tmp / "aoti-compile.json")}
    return {"cold" if cold else "shared_cache": run_worker(spec, env, opts.timeout)}


def latency(backend: str, model: str, tmp: Path, opts: argparse.Namespace) -> dict[str, Any]:
    spec = {"task": "latency", "backend": backend, "model": model, "build": str(tmp / "kiln-out"),
            "package": str(tmp / "aoti.pt2"), "warmup": opts.warmup, "runs": opts.runs,
            "result": str(tmp / f"latency-{backend}.json")}
    return run_worker(spec, worker_env(tmp, f"latency-{backend}"), opts.timeout)


def bench_model(model: str, opts: argparse.Namespace, shared: Path) -> dict[str, Any]:
    result: dict[str, Any] = {"model": model}
    with tempfile.TemporaryDirectory(prefix=f"bench-cuda-{model}-") as name:
        tmp = Path(name)
        # kiln first: its weights.safetensors is the weights every other backend runs with
        result["kiln"] = kiln_compiles(model, tmp, opts)
        result["aoti"] = aoti_compile_run(model, tmp, opts, shared)
        result["eager"] = {"latency": latency("eager", model, tmp, opts)}
        result["torch_compile"] = {"latency": latency("torch_compile", model, tmp, opts)}
        if (tmp / "aoti.pt2").is_file():
            result["aoti"]["latency"] = latency("aoti", model, tmp, opts)
        if "error" not in result["kiln"]:
            result["kiln"]["latency"] = latency("kiln", model, tmp, opts)
    result["ratios"] = ratios(result)
    return result


# ---- ratios, the tables and the targets ----


def ratios(result: dict[str, Any]) -> dict[str, float | None]:
    kiln_ms = pick(result, "kiln", "latency", "median_ms")
    return {
        "kiln_over_eager_latency": ratio(kiln_ms, pick(result, "eager", "latency", "median_ms")),
        "kiln_over_torch_compile_latency": ratio(kiln_ms, pick(result, "torch_compile", "latency",
                                                               "median_ms")),
        "kiln_over_aoti_latency": ratio(kiln_ms, pick(result, "aoti", "latency", "median_ms")),
        "kiln_over_aoti_cold_compile": ratio(pick(result, "kiln", "cold", "process_s"),
                                             pick(result, "aoti", "cold", "process_s")),
    }


LATENCY_COLUMNS: Columns = (
    ("kiln ms", ("kiln", "latency", "median_ms")),
    ("eager ms", ("eager", "latency", "median_ms")),
    ("compile ms", ("torch_compile", "latency", "median_ms")),
    ("AOTI ms", ("aoti", "latency", "median_ms")),
    ("kiln/compile", ("ratios", "kiln_over_torch_compile_latency")),
    ("kiln err", ("kiln", "latency", "max_abs_error")),
    ("compile err", ("torch_compile", "latency", "max_abs_error")),
    ("AOTI err", ("aoti", "latency", "max_abs_error")),
)
COMPILE_COLUMNS: Columns = (
    ("kiln cold s", ("kiln", "cold", "process_s")),
    ("kiln noop s", ("kiln", "recompile", "process_s")),
    ("AOTI cold s", ("aoti", "cold", "process_s")),
    ("kiln/AOTI cold", ("ratios", "kiln_over_aoti_cold_compile")),
    ("link s", ("kiln", "cold", "link_s")),
    ("peak GPU MB", ("kiln", "memory", "peak_mb")),
    ("peak/largest", ("kiln", "memory", "peak_over_largest")),
    ("weights MB", ("kiln", "memory", "weight_mb")),
)


def errors(results: list[dict[str, Any]]) -> list[str]:
    found = []
    for r in results:
        for backend in ("kiln", "aoti", "eager", "torch_compile"):
            part = r.get(backend, {})
            for where, value in [("", part), *part.items()]:
                if isinstance(value, dict) and "error" in value:
                    label = f"{backend} {where}".strip()
                    found.append(f"{r['model']} {label}: {value['error']}")
    return found


def target(ok: bool | None, text: str) -> str:
    """A PASS/MISS line; a target that was not measured is a MISS that says so."""
    if ok is None:
        return f"MISS  {text} (not measured)"
    return f"{'PASS' if ok else 'MISS'}  {text}"


def below(value: float | None, bound: float | None) -> bool | None:
    return None if value is None or bound is None else value < bound


def targets(results: list[dict[str, Any]]) -> list[str]:
    lines = []
    for r in results:
        kiln_ms = pick(r, "kiln", "latency", "median_ms")
        compile_ms = pick(r, "torch_compile", "latency", "median_ms")
        ok = None if kiln_ms is None or compile_ms is None else kiln_ms <= compile_ms
        lines.append(target(ok, f"{r['model']}: kiln latency {cell(kiln_ms)} ms <= torch.compile "
                                f"{cell(compile_ms)} ms"))
    for r in results:
        peak, largest = pick(r, "kiln", "memory", "peak_bytes"), pick(r, "kiln", "memory",
                                                                     "largest_inputs_bytes")
        bound = None if largest is None else 1.2 * largest
        lines.append(target(below(peak, bound), f"{r['model']}: peak GPU memory during compile "
                                                f"{cell(mb(peak))} MB < 1.2 x largest kernel inputs "
                                                f"{cell(mb(largest))} MB"))
    for r in (r for r in results if r["model"] == "bert"):
        kiln_s, aoti_s = pick(r, "kiln", "cold", "process_s"), pick(r, "aoti", "cold", "process_s")
        half = None if aoti_s is None else 0.5 * aoti_s
        lines.append(target(below(kiln_s, half), f"bert: kiln cold compile {cell(kiln_s)} s < "
                                                 f"0.5 x AOTI cold compile {cell(aoti_s)} s"))
        link_s = pick(r, "kiln", "cold", "link_s")
        lines.append(target(below(link_s, 3.0), f"bert: link {cell(link_s)} s < 3 s"))
    return lines


def mb(n: float | None) -> float | None:
    return None if n is None else round(n / _MB, 2)


# ---- the workers: one job each, in a fresh process ----


def model_and_inputs(spec: dict[str, Any]) -> tuple[Any, tuple[Any, ...]]:
    """The eager module with the kiln build's weights (if it was built) and the random inputs,
    both on the GPU."""
    import torch

    from pipeline.config import load_config
    from pipeline.run_model import eager_model, random_inputs

    config = load_config(spec["model"])
    module = eager_model(config, Path(spec["build"])).cuda()
    inputs = tuple(t.cuda() if isinstance(t, torch.Tensor) else t for t in random_inputs(config))
    return module, inputs


def aoti_compile(spec: dict[str, Any]) -> dict[str, Any]:
    import torch

    module, args = model_and_inputs(spec)
    with torch.no_grad():
        t0 = time.perf_counter()
        program = torch.export.export(module, args)
        t1 = time.perf_counter()
        torch._inductor.aoti_compile_and_package(program, package_path=spec["package"])
        t2 = time.perf_counter()
    return {"export_s": round(t1 - t0, 3), "compile_s": round(t2 - t1, 3)}


def loaded(spec: dict[str, Any], module: Any) -> Callable[..., Any]:
    import torch

    backend = spec["backend"]
    if backend == "aoti":
        runner: Callable[..., Any] = torch._inductor.aoti_load_package(spec["package"])
        return runner
    if backend == "kiln":
        from pipeline.loader import load

        return load(spec["build"])
    if backend == "torch_compile":
        compiled: Callable[..., Any] = torch.compile(module)
        return compiled
    return module  # type: ignore[no-any-return]


def synced(fn: Callable[..., Any], args: tuple[Any, ...]) -> tuple[Any, float]:
    """fn(*args) and its seconds, timed from an idle GPU to the end of its work."""
    import torch

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = fn(*args)
    torch.cuda.synchronize()
    return out, time.perf_counter() - t0


def measure_latency(spec: dict[str, Any]) -> dict[str, Any]:
    import torch

    from pipeline.run_model import max_error

    module, args = model_and_inputs(spec)
    with torch.no_grad():
        want, _ = synced(module, args)
        t0 = time.perf_counter()
        fn = loaded(spec, module)
        load_s = time.perf_counter() - t0
        got, first_s = synced(fn, args)  # torch.compile compiles here
        error = max_error(got, want)
        for _ in range(spec["warmup"]):
            synced(fn, args)
        seconds = [synced(fn, args)[1] for _ in range(spec["runs"])]
    return {"median_ms": round(statistics.median(seconds) * 1e3, 4),
            "min_ms": round(min(seconds) * 1e3, 4), "max_abs_error": error,
            "load_s": round(load_s, 3), "first_call_s": round(first_s, 3)}


def machine() -> dict[str, Any]:
    import torch

    return {"gpu": torch.cuda.get_device_name(), "gpus": torch.cuda.device_count(),
            "torch": torch.__version__, "triton": package_version("triton"),
            "cuda": torch.version.cuda, "python": sys.version.split()[0]}


def package_version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def worker(spec: dict[str, Any]) -> None:
    """Write the job's result, or the error it raised, to spec['result']."""
    jobs: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
        "aoti-compile": aoti_compile, "latency": measure_latency, "machine": lambda _: machine()}
    try:
        found = jobs[spec["task"]](spec)
    except Exception as err:  # a failed backend is a result, not the end of the run
        found = {"error": f"{type(err).__name__}: {err}"[-ERROR_CHARS:]}
    Path(spec["result"]).write_text(json.dumps(found) + "\n")


# ---- the command line ----


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("models", nargs="*", default=list(DEFAULT_MODELS))
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--aoti-all", action="store_true",
                        help="a cold AOTI compile for every model (default: bert only)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per process")
    parser.add_argument("--json", type=Path, default=ROOT / "build" / "bench-cuda-backend.json")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def main(argv: list[str]) -> int:
    opts = parse_args(argv)
    if opts.worker:
        worker(json.loads(opts.worker))
        return 0
    if not cuda_available():
        print("bench/cuda_backend.py needs a CUDA GPU: torch.cuda.is_available() is False",
              file=sys.stderr)
        return 2
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-cuda-") as name:
        shared = Path(name)  # the caches of the non-cold AOTI compiles
        # the GPU's name in a worker: this process never makes a CUDA context of its own
        spec = {"task": "machine", "result": str(shared / "machine.json")}
        found = run_worker(spec, worker_env(shared, "machine"), opts.timeout)
        for model in opts.models:
            print(f"{model} ...", file=sys.stderr, flush=True)
            results.append(bench_model(model, opts, shared))
    report = {"machine": found, "warmup": opts.warmup, "runs": opts.runs, "aoti_all": opts.aoti_all,
              "results": results}
    print(f"GPU {found.get('gpu')}; torch {found.get('torch')}, triton {found.get('triton')}, "
          f"CUDA {found.get('cuda')}\n")
    if "error" in found:
        print(f"machine: {found['error']}\n")
    print(f"latency on the GPU (median of {opts.runs} synchronized calls after {opts.warmup})\n"
          f"{table(results, LATENCY_COLUMNS, width=14)}\n")
    print(f"compile (wall seconds of fresh processes; peak GPU MB of kiln's autotune)\n"
          f"{table(results, COMPILE_COLUMNS, width=14)}")
    for line in errors(results):
        print(f"\n{line}")
    print("\ntargets")
    for line in targets(results):
        print(line)
    opts.json.parent.mkdir(parents=True, exist_ok=True)
    opts.json.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwrote {opts.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
