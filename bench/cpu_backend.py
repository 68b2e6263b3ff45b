"""CPU backend benchmark (not a timed test): `python bench/cpu_backend.py [MODEL ...]`.

For each model (default: mlp bert-small gpt2-small), in one run on one machine:
  AOTInductor  cold compile (export + aoti_compile_and_package, fresh inductor cache and
               TMPDIR, fresh process), a second compile in a fresh process on those caches,
               a compile on a fresh inductor cache with the precompiled headers already
               built (see AOTI_RUNS), then latency of the package loaded with
               aoti_load_package;
  kiln         cold compile (`python -m pipeline compile MODEL --target cpu`, fresh cache), a
               no-op recompile, the link stage's seconds from report.json, then latency of
               `pipeline.load(out)`;
  eager        latency under torch.no_grad().
Latency is the median of --runs calls after --warmup calls. Every compile and every latency
measurement runs in its own process (this file with --worker), so nothing is warm, a native
crash in one backend costs only that measurement, and each process runs with the same thread
count. A failing backend is recorded as an error string and the run goes on.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
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

from bench.report_table import ERROR_CHARS, Columns, pick, ratio, table, tail  # noqa: E402

DEFAULT_MODELS = ("mlp", "bert-small", "gpt2-small")

# Note: both cold-compile figures are the wall time of a whole fresh process (python start,
# torch import, building the model, export, compile), since that is what `kiln compile` costs
# a user and what its cold time measures; the ratio kiln cold / AOTI cold compares the two.
# The AOTI worker also reports export_s and compile_s measured inside the process.


# ---- the parent: runs workers and the kiln CLI, collects results ----


# Note: compiles get the thread count too, not only latency runs: inductor's C++ codegen bakes
# torch.get_num_threads() into its parallel loops, and kiln's autotune times kernels with it.
def worker_env(threads: int, tmpdir: Path, inductor_cache: Path | None = None) -> dict[str, str]:
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    tmpdir.mkdir(parents=True, exist_ok=True)  # tempfile ignores a TMPDIR that does not exist
    env = dict(os.environ, PYTHONPATH=path, OMP_NUM_THREADS=str(threads), TMPDIR=str(tmpdir))
    if inductor_cache is not None:
        env["TORCHINDUCTOR_CACHE_DIR"] = str(inductor_cache)
    return env


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
                "process_s": seconds}
    found: dict[str, Any] = json.loads(result.read_text())
    found["process_s"] = round(seconds, 3)
    return found


# Note: TORCHINDUCTOR_CACHE_DIR does not hold all of AOTInductor's cache. Its precompiled
# headers (~280 MB, ~10 s to build on a small machine) go to $TMPDIR/torchinductor_$USER,
# shared by every cache dir and kept across runs, so a fresh TORCHINDUCTOR_CACHE_DIR alone is
# only cold the first time on a machine. Each run here gets its own TMPDIR as well: "cold" has
# both empty; "recompile" reuses both; "cold_pch_warm" is a new inductor cache with the headers
# already built (a new model on a machine where AOTI has compiled before). In AOT mode
# inductor skips its FX graph cache, so a recompile redoes export, lowering and codegen and
# saves only the C++ compiles of unchanged sources.
AOTI_RUNS = (("cold", "pch", "inductor-a"), ("recompile", "pch", "inductor-a"),
             ("cold_pch_warm", "pch", "inductor-b"))


def aoti_compiles(model: str, tmp: Path, opts: argparse.Namespace) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for run, tmpdir, cache in AOTI_RUNS:
        env = worker_env(opts.threads, tmp / tmpdir, tmp / cache)
        spec = {"task": "aoti-compile", "model": model, "package": str(tmp / f"{run}.pt2"),
                "threads": opts.threads, "result": str(tmp / f"aoti-{run}.json")}
        found[run] = run_worker(spec, env, opts.timeout)
        if "error" in found[run]:
            break
    return found


def kiln_cli(model: str, tmp: Path, opts: argparse.Namespace) -> tuple[float, dict[str, Any]]:
    env = dict(worker_env(opts.threads, tmp / "kiln-tmp"), KILN_CACHE_DIR=str(tmp / "kiln-cache"))
    out = tmp / "kiln-out"
    cmd = [sys.executable, "-m", "pipeline", "compile", model, "--quiet", "--target", "cpu",
           "--out", str(out)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=opts.timeout, check=False)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"kiln compile exited {proc.returncode}: "
                           f"{tail(proc.stderr + proc.stdout)}")
    return seconds, json.loads((out / "report.json").read_text())


def link_row(report: dict[str, Any]) -> dict[str, Any]:
    rows = {row["stage"]: row for row in report["stages"]}
    row = rows.get("link", {})
    ran = row.get("status") == "ran"
    return {"link_s": row.get("seconds") if ran else None, "link_status": row.get("status"),
            "link_note": row.get("note")}


def kiln_compiles(model: str, tmp: Path, opts: argparse.Namespace) -> dict[str, Any]:
    try:
        cold_s, report = kiln_cli(model, tmp, opts)
        found: dict[str, Any] = {"cold": {"process_s": round(cold_s, 3), **link_row(report)}}
        noop_s, again = kiln_cli(model, tmp, opts)
    except (RuntimeError, OSError, ValueError, subprocess.TimeoutExpired) as err:
        return {"error": str(err)[-ERROR_CHARS:]}
    statuses = {row["stage"]: row["status"] for row in again["stages"]}
    found["recompile"] = {"process_s": round(noop_s, 3), "stages": statuses}
    return found


def latency(backend: str, model: str, path: Path | None, tmp: Path,
            opts: argparse.Namespace) -> dict[str, Any]:
    spec = {"task": "latency", "backend": backend, "model": model,
            "path": None if path is None else str(path), "threads": opts.threads,
            "warmup": opts.warmup, "runs": opts.runs, "result": str(tmp / f"latency-{backend}.json")}
    return run_worker(spec, worker_env(opts.threads, tmp / "latency-tmp"), opts.timeout)


def bench_model(model: str, opts: argparse.Namespace) -> dict[str, Any]:
    result: dict[str, Any] = {"model": model}
    with tempfile.TemporaryDirectory(prefix=f"bench-cpu-{model}-") as name:
        tmp = Path(name)
        if "aoti" in opts.backends:
            result["aoti"] = aoti_compiles(model, tmp, opts)
        if "kiln" in opts.backends:
            result["kiln"] = kiln_compiles(model, tmp, opts)
        if "eager" in opts.backends:
            result["eager"] = {"latency": latency("eager", model, None, tmp, opts)}
        if "aoti" in opts.backends and "error" not in result["aoti"]["cold"]:
            result["aoti"]["latency"] = latency("aoti", model, tmp / "cold.pt2", tmp, opts)
        if "kiln" in opts.backends and "error" not in result["kiln"]:
            result["kiln"]["latency"] = latency("kiln", model, tmp / "kiln-out", tmp, opts)
    result["ratios"] = ratios(result)
    return result


# ---- ratios and the table ----


def ratios(result: dict[str, Any]) -> dict[str, float | None]:
    kiln_ms = pick(result, "kiln", "latency", "median_ms")
    return {
        "kiln_over_eager_latency": ratio(kiln_ms, pick(result, "eager", "latency", "median_ms")),
        "kiln_over_aoti_latency": ratio(kiln_ms, pick(result, "aoti", "latency", "median_ms")),
        "kiln_over_aoti_cold_compile": ratio(pick(result, "kiln", "cold", "process_s"),
                                             pick(result, "aoti", "cold", "process_s")),
    }


COMPILE_COLUMNS: Columns = (
    ("AOTI cold s", ("aoti", "cold", "process_s")),
    ("AOTI again s", ("aoti", "recompile", "process_s")),
    ("AOTI pch-warm s", ("aoti", "cold_pch_warm", "process_s")),
    ("kiln cold s", ("kiln", "cold", "process_s")),
    ("kiln noop s", ("kiln", "recompile", "process_s")),
    ("kiln link s", ("kiln", "cold", "link_s")),
    ("kiln/AOTI cold", ("ratios", "kiln_over_aoti_cold_compile")),
    ("AOTI load s", ("aoti", "latency", "load_s")),
    ("kiln load s", ("kiln", "latency", "load_s")),
)
LATENCY_COLUMNS: Columns = (
    ("eager ms", ("eager", "latency", "median_ms")),
    ("AOTI ms", ("aoti", "latency", "median_ms")),
    ("kiln ms", ("kiln", "latency", "median_ms")),
    ("kiln/eager", ("ratios", "kiln_over_eager_latency")),
    ("kiln/AOTI", ("ratios", "kiln_over_aoti_latency")),
    ("AOTI max err", ("aoti", "latency", "max_abs_error")),
    ("kiln max err", ("kiln", "latency", "max_abs_error")),
)


def errors(results: list[dict[str, Any]]) -> list[str]:
    found = []
    for r in results:
        for backend in ("aoti", "kiln", "eager"):
            part = r.get(backend, {})
            for where, value in [("", part), *part.items()]:
                if isinstance(value, dict) and "error" in value:
                    label = f"{backend} {where}".strip()
                    found.append(f"{r['model']} {label}: {value['error']}")
    return found


# ---- the workers: one job each, in a fresh process ----


def model_and_inputs(model: str) -> tuple[Any, tuple[Any, ...]]:
    from pipeline.config import load_config
    from tasks.trace.factory import build_model, example_inputs
    from tasks.trace.weights import load_checkpoint

    cfg = load_config(model)
    fields = {k: cfg.job_value(k) for k in cfg.fields}
    module = build_model(fields, cfg.name, cfg.project_root)
    if cfg.checkpoint is not None:
        load_checkpoint(module, cfg.checkpoint, cfg.name)
    return module, example_inputs(fields["inputs"], fields["weights.seed"])


def aoti_compile(spec: dict[str, Any]) -> dict[str, Any]:
    import torch

    module, args = model_and_inputs(spec["model"])
    with torch.no_grad():
        t0 = time.perf_counter()
        program = torch.export.export(module, args)
        t1 = time.perf_counter()
        torch._inductor.aoti_compile_and_package(program, package_path=spec["package"])
        t2 = time.perf_counter()
    return {"export_s": round(t1 - t0, 3), "compile_s": round(t2 - t1, 3)}


def loaded(backend: str, path: str | None, module: Any) -> Callable[..., Any]:
    import torch

    if backend == "aoti":
        assert path is not None
        runner: Callable[..., Any] = torch._inductor.aoti_load_package(path)
        return runner
    if backend == "kiln":
        from pipeline import load

        fn: Callable[..., Any] = load(path)
        return fn
    return module  # type: ignore[no-any-return]


def max_abs_error(got: Any, want: Any) -> float:
    import torch
    from torch.utils._pytree import tree_leaves

    pairs = list(zip(tree_leaves(got), tree_leaves(want), strict=True))
    if not all(isinstance(g, torch.Tensor) for g, _ in pairs):
        raise TypeError(f"output is not tensors: {type(got).__name__}")
    return max((float((g.float() - w.float()).abs().max()) for g, w in pairs), default=0.0)


def time_calls(fn: Callable[..., Any], args: tuple[Any, ...], warmup: int, runs: int) -> list[float]:
    for _ in range(warmup):
        fn(*args)
    seconds = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn(*args)
        seconds.append(time.perf_counter() - t0)
    return seconds


# Note: load_s is the first load in a process with an empty inductor cache (as on a machine
# the package was shipped to). aoti_load_package then spends most of it in pick_vec_isa, which
# compiles and dlopens small C++ probes to find the CPU's vector ISA; they land in the inductor
# cache, so later loads on that machine are faster.
def measure_latency(spec: dict[str, Any]) -> dict[str, Any]:
    import torch

    torch.set_num_threads(spec["threads"])
    module, args = model_and_inputs(spec["model"])
    with torch.no_grad():
        want = module(*args)
        t0 = time.perf_counter()
        fn = loaded(spec["backend"], spec["path"], module)
        load_s = time.perf_counter() - t0
        error = max_abs_error(fn(*args), want)
        seconds = time_calls(fn, args, spec["warmup"], spec["runs"])
    return {"median_ms": round(statistics.median(seconds) * 1e3, 4),
            "min_ms": round(min(seconds) * 1e3, 4), "max_abs_error": error, "load_s": round(load_s, 3),
            "threads": torch.get_num_threads()}


def worker(spec: dict[str, Any]) -> None:
    """Write the job's result, or the error it raised, to spec['result']."""
    jobs = {"aoti-compile": aoti_compile, "latency": measure_latency}
    try:
        found = jobs[spec["task"]](spec)
    except Exception as err:  # a failed backend is a result, not the end of the run
        found = {"error": f"{type(err).__name__}: {err}"[-ERROR_CHARS:]}
    Path(spec["result"]).write_text(json.dumps(found) + "\n")


# ---- the command line ----


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("models", nargs="*", default=list(DEFAULT_MODELS))
    parser.add_argument("--backends", default="eager,aoti,kiln",
                        help="comma-separated subset of eager,aoti,kiln")
    parser.add_argument("--threads", type=int, default=0,
                        help="threads for every measurement (default: torch.get_num_threads())")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per process")
    parser.add_argument("--json", type=Path, default=ROOT / "build" / "bench-cpu-backend.json")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def cpu_name() -> str | None:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return None
    names = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
    return names[0] if names else None


def machine(threads: int) -> dict[str, Any]:
    import platform

    import torch

    return {"threads": threads, "cpu_count": os.cpu_count(),
            "affinity": len(os.sched_getaffinity(0)), "cpu": cpu_name() or platform.machine(),
            "torch": torch.__version__, "cxx": shutil.which("c++"),
            "loadavg_1m": round(os.getloadavg()[0], 2)}


def main(argv: list[str]) -> None:
    opts = parse_args(argv)
    if opts.worker:
        worker(json.loads(opts.worker))
        return
    import torch

    opts.threads = opts.threads or torch.get_num_threads()
    opts.backends = set(opts.backends.split(","))
    start = machine(opts.threads)  # the load average before this run adds its own
    results = []
    for model in opts.models:
        print(f"{model} ...", file=sys.stderr, flush=True)
        results.append(bench_model(model, opts))
    found = {"machine": start, "warmup": opts.warmup, "runs": opts.runs,
             "results": results}
    print(f"compile (wall seconds of fresh processes)\n{table(results, COMPILE_COLUMNS)}\n")
    print(f"latency (median of {opts.runs} calls after {opts.warmup}; {opts.threads} threads, "
          f"{os.cpu_count()} cores; load average {start['loadavg_1m']} at the start)\n"
          f"{table(results, LATENCY_COLUMNS)}")
    for line in errors(results):
        print(f"\n{line}")
    opts.json.parent.mkdir(parents=True, exist_ok=True)
    opts.json.write_text(json.dumps(found, indent=2) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
