"""CPU backend benchmark (not a timed test): `python bench/cpu_backend.py [MODEL ...]`.

For each model (default: mlp bert-small gpt2-small), in one run on one machine:
  AOTInductor  cold compile (export + aoti_compile_and_package, fresh inductor cache and
               TMPDIR, fresh process), a second compile in a fresh process on those caches,
               a compile on a fresh inductor cache with the precompiled headers already
               built (see AOTI_RUNS), then latency of the package loaded with
               aoti_load_package;
  kiln         cold compile (`python -m kiln compile MODEL --target cpu`, fresh cache), a
               no-op recompile, the link stage's seconds from report.json, then latency of
               `kiln.load(out)`;
  eager        latency under torch.no_grad().
Latency is the median of --runs calls after --warmup calls. Every compile and every latency
measurement runs in its own process (bench/workers.py), so nothing is warm, a native
crash in one backend costs only that measurement, and each process runs with the same thread
count. A failing backend is recorded as an error string and the run goes on.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.kiln_runs import kiln_compile, link_row  # noqa: E402
from bench.procs import child_env, host_facts, run_worker  # noqa: E402
from bench.report_table import Columns, pick, ratio, table  # noqa: E402

DEFAULT_MODELS = ("mlp", "bert-small", "gpt2-small")

# Note: both cold-compile figures are the wall time of a whole fresh process (python start,
# torch import, building the model, export, compile), since that is what `kiln compile` costs
# a user and what its cold time measures; the ratio kiln cold / AOTI cold compares the two.
# The AOTI worker also reports export_s and compile_s measured inside the process.


# ---- the parent: runs workers (bench/workers.py) and the kiln CLI, collects results ----


def spec(task: str, model: str, tmp: Path, name: str, opts: argparse.Namespace,
         **fields: Any) -> dict[str, Any]:
    return {"task": task, "model": model, "build": str(tmp / "kiln-out"), "device": "cpu",
            "threads": opts.threads, "warmup": opts.warmup, "runs": opts.runs,
            "result": str(tmp / f"{name}.json"), **fields}


# Note: AOTInductor's precompiled headers (~280 MB, ~10 s to build on a small machine) go to
# $TMPDIR/torchinductor_$USER, not to TORCHINDUCTOR_CACHE_DIR, so a fresh inductor cache alone is
# only cold the first time on a machine. "cold" has both empty; "recompile" reuses both;
# "cold_pch_warm" is a new inductor cache with the headers already built (a new model on a
# machine where AOTI has compiled before). In AOT mode inductor skips its FX graph cache, so a
# recompile redoes export, lowering and codegen and saves only the C++ compiles of unchanged
# sources.
AOTI_RUNS = (("cold", "aoti-a"), ("recompile", "aoti-a"), ("cold_pch_warm", "aoti-b"))


def aoti_compiles(model: str, tmp: Path, opts: argparse.Namespace) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for run, caches in AOTI_RUNS:
        env = child_env(tmp / caches, opts.threads, tmpdir=tmp / "aoti-a" / "tmp")
        job = spec("compile", model, tmp, f"aoti-{run}", opts, engine="aoti", package=str(tmp / f"{run}.pt2"))
        found[run] = run_worker(job, env, opts.timeout)
        if "error" in found[run]:
            break
    return found


def kiln_compiles(model: str, tmp: Path, opts: argparse.Namespace) -> dict[str, Any]:
    env = child_env(tmp / "kiln", opts.threads)
    cold = kiln_compile(model, "cpu", tmp / "kiln-out", env, opts.timeout)
    if "error" in cold:
        return {"error": cold["error"]}
    found: dict[str, Any] = {"cold": {"process_s": cold["seconds"], **link_row(cold["report"])}}
    again = kiln_compile(model, "cpu", tmp / "kiln-out", env, opts.timeout)
    if "error" in again:
        return {**found, "recompile": {"error": again["error"]}}
    statuses = {name: row["status"] for name, row in again["stages"].items()}
    found["recompile"] = {"process_s": again["seconds"], "stages": statuses}
    return found


# Note: load_s is the first load in a process with an empty inductor cache (as on a machine the
# package was shipped to): each latency process has caches of its own.
def latency(engine: str, model: str, tmp: Path, opts: argparse.Namespace) -> dict[str, Any]:
    job = spec("latency", model, tmp, f"latency-{engine}", opts, engine=engine, package=str(tmp / "cold.pt2"))
    return run_worker(job, child_env(tmp / f"latency-{engine}", opts.threads), opts.timeout)


def bench_model(model: str, opts: argparse.Namespace) -> dict[str, Any]:
    result: dict[str, Any] = {"model": model}
    with tempfile.TemporaryDirectory(prefix=f"bench-cpu-{model}-") as name:
        tmp = Path(name)
        if "kiln" in opts.backends:  # first: its build's weights are what the others run
            result["kiln"] = kiln_compiles(model, tmp, opts)
        if "aoti" in opts.backends:
            result["aoti"] = aoti_compiles(model, tmp, opts)
        if "eager" in opts.backends:
            result["eager"] = {"latency": latency("eager", model, tmp, opts)}
        if "aoti" in opts.backends and "error" not in result["aoti"]["cold"]:
            result["aoti"]["latency"] = latency("aoti", model, tmp, opts)
        if "kiln" in opts.backends and "error" not in result["kiln"]:
            result["kiln"]["latency"] = latency("kiln", model, tmp, opts)
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
    return parser.parse_args(argv)


def machine(threads: int) -> dict[str, Any]:
    import torch

    return {**host_facts(), "threads": threads, "torch": torch.__version__}


def main(argv: list[str]) -> None:
    opts = parse_args(argv)
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
