"""The benchmarks' worker jobs, one per fresh process: `python -m bench.workers SPEC_JSON`.

A spec names its task and the file its result goes to ("result"); bench/procs.py's run_worker
starts the process and reads the result. Jobs:
  machine     the torch, triton, CUDA and GPU versions and the thread count torch would use;
  compile     AOTInductor (export + aoti_compile_and_package) or torch.compile (its first,
              compiling call), the moment it is ready, its peak memory so far, then optionally
              the latency of what it compiled, in the same process;
  latency     load an engine's artifact (or none: eager), check it against eager, time it;
  checkpoint  save a model's weights, made with another seed, as a safetensors file;
  layer-knob  find the kwarg that sets a model's layer count (bench/edits.py).
Every engine runs the same module (a kiln build's weights where there is one) on the same
random inputs (kiln.run_model), on spec["device"].
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import resource
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.procs import UNFINISHED, error_text

Job = Callable[[dict[str, Any]], dict[str, Any]]


def model_and_inputs(spec: dict[str, Any]) -> tuple[Any, tuple[Any, ...]]:
    """The eager module (weights from the kiln build in spec["build"] if there is one, else the
    config's seed or checkpoint) and the random inputs, both on spec["device"]."""
    import torch

    from kiln import load_config
    from kiln.run_model import eager_model, load_checkpoint, random_inputs

    config = load_config(spec["model"])
    build = Path(spec["build"])
    module = eager_model(config, build)
    if not (build / "weights.safetensors").is_file() and config.checkpoint is not None:
        load_checkpoint(module, config)
    device = spec.get("device", "cpu")
    inputs = tuple(t.to(device) if isinstance(t, torch.Tensor) else t for t in random_inputs(config))
    return module.to(device), inputs


def set_threads(spec: dict[str, Any]) -> None:
    import torch

    if spec.get("threads"):
        torch.set_num_threads(spec["threads"])


def on_gpu(spec: dict[str, Any]) -> bool:
    return bool(spec.get("device") == "cuda")


def sync(spec: dict[str, Any]) -> None:
    import torch

    if on_gpu(spec):
        torch.cuda.synchronize()


def peak_gpu_bytes(spec: dict[str, Any]) -> int | None:
    import torch

    return int(torch.cuda.max_memory_allocated()) if on_gpu(spec) else None


def peak_rss_bytes() -> int:
    """This process's peak RSS so far, or a finished child's (inductor's compile workers) if larger."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return max(own, children) * 1024


def time_calls(fn: Callable[..., Any], args: tuple[Any, ...], spec: dict[str, Any]) -> list[float]:
    """Seconds of spec["runs"] calls after spec["warmup"]: perf_counter on the CPU; on the GPU,
    CUDA events around each call, started from an idle GPU so queued work hides nothing."""
    import torch

    for _ in range(spec["warmup"]):
        fn(*args)
    seconds = []
    for _ in range(spec["runs"]):
        if on_gpu(spec):
            start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            torch.cuda.synchronize()
            start.record()
            fn(*args)
            end.record()
            end.synchronize()
            seconds.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn(*args)
            seconds.append(time.perf_counter() - t0)
    return seconds


def compile_mode(engine: str) -> str | None:
    """torch.compile's mode in an engine's name ("torch.compile:reduce-overhead"; None: default)."""
    return engine.partition(":")[2] or None


def loaded(engine: str, spec: dict[str, Any], module: Any) -> Callable[..., Any]:
    import torch

    if engine == "aoti":
        runner: Callable[..., Any] = torch._inductor.aoti_load_package(spec["package"])
        return runner
    if engine == "kiln":
        from kiln import load

        loaded: Callable[..., Any] = load(spec["build"])
        return loaded
    if engine.startswith("torch.compile"):
        compiled: Callable[..., Any] = torch.compile(module, mode=compile_mode(engine))
        return compiled
    if engine == "eager":
        return module  # type: ignore[no-any-return]
    raise ValueError(f"unknown engine {engine!r}")


def latency_of(fn: Callable[..., Any], module: Any, args: tuple[Any, ...],
               spec: dict[str, Any]) -> dict[str, Any]:
    """Max abs error of fn against the eager module, then the latency of fn."""
    import torch

    from kiln.run_model import max_error

    want = module(*args)
    t0 = time.perf_counter()
    got = fn(*args)  # torch.compile compiles here when nothing compiled it before
    sync(spec)
    first_s = time.perf_counter() - t0
    if on_gpu(spec):
        torch.cuda.reset_peak_memory_stats()
    seconds = time_calls(fn, args, spec)
    return {"median_ms": round(statistics.median(seconds) * 1e3, 4),
            "min_ms": round(min(seconds) * 1e3, 4), "max_abs_error": max_error(got, want),
            "first_call_s": round(first_s, 3), "runs": len(seconds), "warmup": spec["warmup"],
            "peak_gpu_bytes": peak_gpu_bytes(spec)}


# Note: load_s is the first load in its process. For AOTI on the CPU with an empty inductor cache
# (a machine the package was shipped to), aoti_load_package spends most of it in pick_vec_isa,
# which compiles and dlopens small C++ probes to find the CPU's vector ISA.
def latency_job(spec: dict[str, Any]) -> dict[str, Any]:
    import torch

    set_threads(spec)
    module, args = model_and_inputs(spec)
    with torch.no_grad():
        t0 = time.perf_counter()
        fn = loaded(spec["engine"], spec, module)
        load_s = time.perf_counter() - t0
        found = latency_of(fn, module, args, spec)
    return {**found, "load_s": round(load_s, 3), "threads": torch.get_num_threads()}


def compiled_now(engine: str, module: Any, args: tuple[Any, ...],
                 spec: dict[str, Any]) -> tuple[Callable[..., Any] | None, dict[str, float]]:
    """Compile with one engine; the compiled callable (None for AOTI: its package is loaded
    later) and the seconds of each phase."""
    import torch

    t0 = time.perf_counter()
    if engine == "aoti":
        program = torch.export.export(module, args)
        t1 = time.perf_counter()
        torch._inductor.aoti_compile_and_package(program, package_path=spec["package"])
        return None, {"export_s": round(t1 - t0, 3), "compile_s": round(time.perf_counter() - t1, 3)}
    if engine.startswith("torch.compile"):
        fn: Callable[..., Any] = torch.compile(module, mode=compile_mode(engine))
        fn(*args)
        sync(spec)
        return fn, {"first_call_s": round(time.perf_counter() - t0, 3)}
    raise ValueError(f"engine {engine!r} has no in-process compile")


def compile_job(spec: dict[str, Any]) -> dict[str, Any]:
    """One compile; "ready_at" is the moment it finished (time.monotonic), and the peaks are
    those up to that moment. With spec["latency"], the latency of the result follows."""
    import torch

    set_threads(spec)
    module, args = model_and_inputs(spec)
    with torch.no_grad():
        fn, phases = compiled_now(spec["engine"], module, args, spec)
        found: dict[str, Any] = {"ready_at": time.monotonic(), "phases": phases,
                                 "peak_rss_bytes_ready": peak_rss_bytes(),
                                 "peak_gpu_bytes": peak_gpu_bytes(spec)}
        if spec.get("latency"):
            write_result(spec, {**found, UNFINISHED: "latency"})
            try:
                t0 = time.perf_counter()
                fn = loaded(spec["engine"], spec, module) if fn is None else fn
                load_s = round(time.perf_counter() - t0, 3)
                found["latency"] = {**latency_of(fn, module, args, spec), "load_s": load_s}
            except Exception as err:  # the compile's figures still count
                found["latency"] = {"error": error_text(err)}
    return found


def checkpoint_job(spec: dict[str, Any]) -> dict[str, Any]:
    """The config's model built with weights seed spec["seed"], saved to spec["path"]."""
    from safetensors.torch import save_file

    from kiln import load_config
    from kiln.run_model import seeded_model

    module = seeded_model(load_config(spec["model"]), spec["seed"])
    # clones: tied weights (an embedding shared with an output layer) share storage, which
    # safetensors refuses to save
    save_file({k: v.contiguous().clone() for k, v in module.state_dict().items()}, spec["path"])
    return {"path": spec["path"], "seed": spec["seed"]}


def layer_knob_job(spec: dict[str, Any]) -> dict[str, Any]:
    from bench.edits import layer_knob
    from kiln import load_config

    return layer_knob(load_config(spec["model"]))


def machine_job(spec: dict[str, Any]) -> dict[str, Any]:
    import torch

    found: dict[str, Any] = {"torch": torch.__version__, "triton": _version("triton"),
                             "threads": torch.get_num_threads(), "python": sys.version.split()[0]}
    if on_gpu(spec) and torch.cuda.is_available():
        found |= {"gpu": torch.cuda.get_device_name(), "gpus": torch.cuda.device_count(),
                  "cuda": torch.version.cuda}
    elif on_gpu(spec):
        found["gpu"] = "no GPU visible to torch"
    return found


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


JOBS: dict[str, Job] = {"machine": machine_job, "compile": compile_job, "latency": latency_job,
                        "checkpoint": checkpoint_job, "layer-knob": layer_knob_job}


def write_result(spec: dict[str, Any], found: dict[str, Any]) -> None:
    result = Path(spec["result"])
    tmp = result.with_name(f".{result.name}.{os.getpid()}")
    tmp.write_text(json.dumps(found) + "\n")
    tmp.replace(result)  # a reader never sees half a result


def main(argv: list[str]) -> int:
    """Write the job's result, or the error it raised, to spec["result"]."""
    spec = json.loads(argv[0])
    try:
        found = JOBS[spec["task"]](spec)
    except Exception as err:  # a failed engine is a result, not the end of the run
        found = {"error": error_text(err)}
    write_result(spec, found)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

