"""CUDA backend benchmark (not a timed test; needs a GPU): `python3 bench/cuda_backend.py [MODEL ...]`.

Usage: python3 bench/cuda_backend.py [MODEL ...] [--runs N] [--aoti-all] [--json PATH]

For each model (default: bert gpt2 resnet18 mlp), in one run on one GPU:
  kiln           cold compile (`python -m kiln compile MODEL --target cuda`, fresh kiln and
                 triton caches), a no-op recompile on the same caches, the link stage's seconds
                 from report.json, the peak GPU memory of the autotune stage (the largest
                 peak_bytes of timings.json, next to the largest kernel's inputs_bytes, and the
                 peak in the autotune row's note) against the model's weight bytes (the tensors
                 of weights.safetensors: a peak far below them shows they never reached the
                 GPU), then latency of `kiln.loader.load(out)`;
  AOTInductor    export + aoti_compile_and_package with model and inputs on the GPU. For bert
                 (every model with --aoti-all) this runs on fresh inductor and triton caches and
                 a fresh TMPDIR, and is the cold compile time; for the others it runs on caches
                 shared by the whole run, only to get a package, and its time is not shown as
                 cold. Then latency of the package loaded with aoti_load_package;
  torch.compile  latency of torch.compile(model) (default mode) after its first, compiling call;
  eager          latency of the module on the GPU under torch.no_grad().
Every backend runs the same module (the kiln build's weights, via kiln.run_model.eager_model)
on the same random inputs; each latency is the median of --runs calls after --warmup calls, with
CUDA events around each timed call from an idle GPU, plus the max abs error against eager.
Every compile and every latency measurement runs in its own process (bench/workers.py),
so nothing is warm and a crash in one backend costs only that measurement; a failing backend is
recorded as an error string and the run goes on. The targets at the end are PASS/MISS lines,
not assertions. Results go to --json (default build/bench-cuda-backend.json).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.kiln_runs import compile_memory, kiln_compile, link_row, mb, stage_seconds  # noqa: E402
from bench.procs import child_env, run_worker  # noqa: E402
from bench.report_table import Columns, cell, pick, ratio, table  # noqa: E402

DEFAULT_MODELS = ("bert", "gpt2", "resnet18", "mlp")
COLD_AOTI_MODELS = ("bert",)  # the models that get a cold AOTI compile without --aoti-all

# Note: both cold-compile figures are the wall time of a whole fresh process (python start,
# torch import, building the model, export, compile), as in bench/cpu_backend.py; the AOTI
# worker also reports export_s and compile_s measured inside the process.


# ---- the parent: runs workers (bench/workers.py) and the kiln CLI, collects results ----


def spec(task: str, model: str, tmp: Path, name: str, opts: argparse.Namespace,
         **fields: Any) -> dict[str, Any]:
    return {"task": task, "model": model, "build": str(tmp / "kiln-out"), "device": "cuda",
            "warmup": opts.warmup, "runs": opts.runs, "package": str(tmp / "aoti.pt2"),
            "result": str(tmp / f"{name}.json"), **fields}


def kiln_compiles(model: str, tmp: Path, opts: argparse.Namespace) -> dict[str, Any]:
    """The cold compile (with its memory), then a no-op recompile on the same cache and folder."""
    env, out = child_env(tmp / "kiln"), tmp / "kiln-out"
    cold = kiln_compile(model, "cuda", out, env, opts.timeout)
    if "error" in cold:
        return {"error": cold["error"]}
    report = cold["report"]
    found: dict[str, Any] = {"cold": {"process_s": cold["seconds"], **link_row(report),
                                      "stages": stage_seconds(report)}}
    found["memory"] = compile_memory(out, report)
    again = kiln_compile(model, "cuda", out, env, opts.timeout)
    if "error" in again:
        found["recompile"] = {"error": again["error"]}
        return found
    statuses = {name: row["status"] for name, row in again["stages"].items()}
    found["recompile"] = {"process_s": again["seconds"], "stages": statuses}
    return found


def aoti_compile_run(model: str, tmp: Path, opts: argparse.Namespace, shared: Path) -> dict[str, Any]:
    """AOTI's compile of one model: cold (own caches) for COLD_AOTI_MODELS or --aoti-all, else
    on the caches shared by the whole run. {"cold": ...} or {"shared_cache": ...}."""
    cold = opts.aoti_all or model in COLD_AOTI_MODELS
    env = child_env(tmp / "aoti-cold") if cold else child_env(shared / "aoti-shared")
    job = spec("compile", model, tmp, "aoti-compile", opts, engine="aoti")
    return {"cold" if cold else "shared_cache": run_worker(job, env, opts.timeout)}


def latency(engine: str, model: str, tmp: Path, opts: argparse.Namespace) -> dict[str, Any]:
    job = spec("latency", model, tmp, f"latency-{engine}", opts, engine=engine)
    return run_worker(job, child_env(tmp / f"latency-{engine}"), opts.timeout)


def bench_model(model: str, opts: argparse.Namespace, shared: Path) -> dict[str, Any]:
    result: dict[str, Any] = {"model": model}
    with tempfile.TemporaryDirectory(prefix=f"bench-cuda-{model}-") as name:
        tmp = Path(name)
        # kiln first: its weights.safetensors is the weights every other backend runs with
        result["kiln"] = kiln_compiles(model, tmp, opts)
        result["aoti"] = aoti_compile_run(model, tmp, opts, shared)
        result["eager"] = {"latency": latency("eager", model, tmp, opts)}
        result["torch_compile"] = {"latency": latency("torch.compile", model, tmp, opts)}
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
    return parser.parse_args(argv)


def cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def main(argv: list[str]) -> int:
    opts = parse_args(argv)
    if not cuda_available():
        print("bench/cuda_backend.py needs a CUDA GPU: torch.cuda.is_available() is False",
              file=sys.stderr)
        return 2
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-cuda-") as name:
        shared = Path(name)  # the caches of the non-cold AOTI compiles
        # the GPU's name in a worker: this process never makes a CUDA context of its own
        job = {"task": "machine", "device": "cuda", "result": str(shared / "machine.json")}
        found = run_worker(job, child_env(shared / "machine"), opts.timeout)
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
