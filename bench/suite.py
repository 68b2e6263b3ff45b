"""`kiln bench MODEL`: kiln against eager, torch.compile and AOTInductor, in one run on one machine.

Per engine, each step in a fresh process (bench/workers.py, or the kiln CLI):
  kiln           cold compile (`kiln compile` on an empty cache), a warm (no-op) recompile, a
                 recompile after a weight swap (a checkpoint made with another seed) and after a
                 one-layer edit (a copy of the config with its layer-count kwarg + 1), then the
                 latency of the cold build;
  torch.compile  cold compile (the first, compiling call, on empty inductor and triton caches)
                 followed by the latency in that process, then a warm compile on those caches;
  aoti           cold and warm compiles with export + aoti_compile_and_package, then the
                 latency of the cold package loaded with aoti_load_package in a fresh process;
  eager          the latency of the module as written (no compile);
  torch.compile:reduce-overhead, torch.compile:max-autotune (cuda only: both replay CUDA graphs)
                 as torch.compile, in that mode.
A compile's seconds are the wall time of a fresh process from its start to compiled and ready
(python start, torch import, building the model included), its peaks those of that process and
of the workers it waited for. Latency is the median of --runs calls after --warmup, with the max
abs error against eager. A step that fails is recorded as an error string; the run goes on.
"""

from __future__ import annotations

import functools
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bench.edits import knob_in_kwargs, write_config
from bench.kiln_runs import compile_memory, kiln_compile
from bench.procs import child_env, host_facts, run_worker
from kiln import KilnError, ModelConfig, load_config

CUDA_ONLY = ("torch.compile:reduce-overhead", "torch.compile:max-autotune")  # their gains are CUDA graphs
ENGINES = ("kiln", "eager", "torch.compile", "aoti", *CUDA_ONLY)
RECOMPILES = ("warm", "weight_swap", "layer_edit")  # after the cold compile, in this order
STEPS = ("cold", *RECOMPILES, "latency")  # each engine's entries in bench.json
KILN_ONLY = {"layer_edit": {"skipped": "measured for kiln only"},
             "weight_swap": {"skipped": "measured for kiln only"}}
LEFT_OUT = {"skipped": "left out by --recompiles"}
KILN_BUILDS = ("kiln", "kiln-weight-swap", "kiln-layer-edit")  # folders in --out


@dataclass(frozen=True)
class BenchOptions:
    model: str
    target: str
    out: Path
    engines: tuple[str, ...] = ENGINES
    recompiles: tuple[str, ...] = RECOMPILES
    runs: int = 50
    warmup: int = 10
    timeout: float = 1800.0  # seconds for one process
    threads: int = 0  # 0: what torch picks on this machine


@dataclass(frozen=True)
class Run:
    """The facts of one bench run that every engine's steps use."""

    opts: BenchOptions
    config: ModelConfig
    tmp: Path  # caches and scratch files, deleted at the end
    threads: int | None
    log: Callable[[str], None]

    @property
    def device(self) -> str:
        return "cuda" if self.opts.target == "cuda" else "cpu"

    @property
    def kiln_build(self) -> Path:
        """The cold kiln build; its weights are the weights every engine runs with."""
        return self.opts.out / KILN_BUILDS[0]

    def env(self, name: str) -> dict[str, str]:
        """The environment of a child whose caches live in tmp/name, with the model's project on
        its path (edited copies of the config live elsewhere but import the same factory)."""
        env = child_env(self.tmp / name, self.threads)
        env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], str(self.config.project_root)])
        return env

    def spec(self, task: str, name: str, **fields: Any) -> dict[str, Any]:
        return {"task": task, "model": str(self.config.path), "build": str(self.kiln_build),
                "device": self.device, "threads": self.threads, "warmup": self.opts.warmup,
                "runs": self.opts.runs, "result": str(self.tmp / f"{name}.json"), **fields}

    def worker(self, spec: dict[str, Any], caches: str) -> dict[str, Any]:
        return run_worker(spec, self.env(caches), self.opts.timeout)

    def kiln(self, config: Path, out: Path) -> dict[str, Any]:
        return kiln_compile(config, self.opts.target, out, self.env("kiln"), self.opts.timeout)


# ---- kiln ----


def bench_kiln(run: Run) -> dict[str, Any]:
    run.log("  kiln: cold compile")
    cold = run.kiln(run.config.path, run.kiln_build)
    if "error" in cold:
        failed = {"skipped": "kiln's cold compile failed"}
        return {"cold": cold, **dict.fromkeys((*RECOMPILES, "latency"), failed)}
    if run.device == "cuda":
        cold["memory"] = compile_memory(run.kiln_build, cold["report"])
        cold["peak_gpu_bytes"] = cold["memory"].get("peak_bytes")
    found = {"cold": cold}
    for step in RECOMPILES:
        if step in run.opts.recompiles:
            run.log(f"  kiln: {step.replace('_', ' ')}")
            waited = wait_for_stage_server(run) if step != "warm" else None
            found[step] = KILN_RECOMPILES[step](run) | ({"server_wait_s": waited} if step != "warm" else {})
        else:
            found[step] = LEFT_OUT
    run.log("  kiln: latency")
    found["latency"] = run.worker(run.spec("latency", "kiln-latency", engine="kiln"), "latency")
    return found


def wait_for_stage_server(run: Run, limit_s: float = 60.0) -> float | None:
    """Seconds waited for kiln's stage server (pipeline/server.py) to listen, or None where it
    did not within the limit (the step then runs in fresh workers, as kiln would).

    Note: the server starts after the cold compile and spends seconds importing; an engineer's
    next compile comes after an edit, so each recompile starts once it listens, as in a dev loop.
    The wait is reported beside the step, never counted in it. Its socket is the sign: it is
    made only once the imports are done, in the compiles' TMPDIR (a folder of this bench's).
    """
    folder = Path(run.env("kiln")["TMPDIR"])
    if not any(folder.glob("kiln-servers-*")):  # the compiles use none (KILN_SERVER=0, a GPU machine)
        return None
    started = time.monotonic()
    while time.monotonic() - started < limit_s:
        if any(folder.glob("kiln-servers-*/*.sock")):
            return round(time.monotonic() - started, 2)
        time.sleep(0.1)
    return None


def warm(run: Run) -> dict[str, Any]:
    """The same compile again on the same cache: a no-op."""
    return without_report(run.kiln(run.config.path, run.kiln_build))


def without_report(found: dict[str, Any]) -> dict[str, Any]:
    """A recompile's figures without its full report (bench.json keeps the cold one only)."""
    return {k: v for k, v in found.items() if k != "report"}


def weight_swap(run: Run) -> dict[str, Any]:
    """A recompile with a new checkpoint of the same architecture (the weights of seed + 1)."""
    seed = run.config.field("weights.seed") + 1
    checkpoint = run.tmp / "edits" / "new-weights.safetensors"
    checkpoint.parent.mkdir(parents=True, exist_ok=True)
    made = run.worker(run.spec("checkpoint", "checkpoint", seed=seed, path=str(checkpoint)), "latency")
    if "error" in made:
        return made
    name = f"{run.config.name}-new-weights"
    path = write_config(run.config, run.tmp / "edits", name, checkpoint=checkpoint)
    found = without_report(run.kiln(path, run.opts.out / KILN_BUILDS[1]))
    return {**found, "edit": f"a new checkpoint (the weights of seed {seed})"}


def layer_edit(run: Run) -> dict[str, Any]:
    """A recompile of a copy of the config whose layer-count kwarg is one more."""
    knob = knob_in_kwargs(run.config) or run.worker(run.spec("layer-knob", "layer-knob"), "latency")
    if "knob" not in knob:
        return {k: v for k, v in knob.items() if k in ("skipped", "error")}
    name, value = knob["knob"], knob["value"]
    kwargs = {**run.config.field("model.kwargs"), name: value + 1}
    # a checkpoint has no weights for the new layer: the edited copy uses seeded weights
    path = write_config(run.config, run.tmp / "edits", f"{run.config.name}-plus-one-layer", kwargs=kwargs,
                        seeded=True)
    found = without_report(run.kiln(path, run.opts.out / KILN_BUILDS[2]))
    seeded = " (seeded weights: the checkpoint has no new layer)" if run.config.checkpoint else ""
    return {**found, "edit": f"{name} {value} -> {value + 1}{seeded}"}


KILN_RECOMPILES: dict[str, Callable[[Run], dict[str, Any]]] = {
    "warm": warm, "weight_swap": weight_swap, "layer_edit": layer_edit}


# ---- torch.compile and AOTInductor ----


# Note: AOTInductor's latency is measured in a fresh process that loads the cold compile's
# package, as a server that was shipped it would, and as kiln's is; torch.compile's can only be
# measured in the process that compiled, where its compiled module lives.
def engines_for(target: str, engines: tuple[str, ...], explicit: bool) -> tuple[str, ...]:
    """The engines a run on `target` measures: every one asked for, less those that are cuda's
    only on the cpu target (an error where they were asked for by name)."""
    off = [engine for engine in engines if engine in CUDA_ONLY and target != "cuda"]
    if off and explicit:
        raise KilnError(f"{', '.join(off)}: CUDA graphs, so the cuda target only",
                        "leave them out of --engines, or bench with --target cuda")
    return tuple(engine for engine in engines if engine not in off)


def bench_inductor(run: Run, engine: str) -> dict[str, Any]:
    """A cold compile (fresh caches), then a warm compile in a fresh process on the caches the
    cold one filled; the latency of the cold compile's result (see the note)."""
    slug, in_process = engine.replace(".", "-").replace(":", "-"), engine.startswith("torch.compile")
    steps = {"warm": LEFT_OUT}
    for step in ("cold", "warm"):
        if step in ("cold", *run.opts.recompiles):
            run.log(f"  {engine}: {step} compile")
            spec = run.spec("compile", f"{slug}-{step}", engine=engine, package=package(run, slug, step),
                            latency=in_process and step == "cold")
            steps[step] = compile_figures(run.worker(spec, slug))
    failed = {"skipped": f"{engine}'s cold compile failed"}
    if in_process or "error" in steps["cold"]:
        latency = steps["cold"].pop("latency", failed)
    else:
        run.log(f"  {engine}: latency")
        spec = run.spec("latency", f"{slug}-latency", engine=engine, package=package(run, slug, "cold"))
        latency = run.worker(spec, slug)
    return {**steps, **KILN_ONLY, "latency": latency}


def package(run: Run, slug: str, step: str) -> str:
    return str(run.tmp / slug / f"{step}.pt2")


def compile_figures(found: dict[str, Any]) -> dict[str, Any]:
    """A compile worker's result as a compile step: seconds and peaks up to the moment it was
    ready (the process's full wall time beside them)."""
    if "error" in found:
        return found
    figures = {"seconds": found["ready_s"], "peak_rss_bytes": found["peak_rss_bytes_ready"],
               "peak_gpu_bytes": found["peak_gpu_bytes"], "phases": found["phases"],
               "process_s": found["process_s"]}
    return figures | ({"latency": found["latency"]} if "latency" in found else {})


def bench_eager(run: Run) -> dict[str, Any]:
    run.log("  eager: latency")
    none = {"skipped": "eager runs the module as written: nothing to compile"}
    latency = run.worker(run.spec("latency", "eager-latency", engine="eager"), "latency")
    return {"cold": none, "warm": none, **KILN_ONLY, "latency": latency}


BENCHES: dict[str, Callable[[Run], dict[str, Any]]] = {
    "kiln": bench_kiln,
    "eager": bench_eager,
    "torch.compile": lambda run: bench_inductor(run, "torch.compile"),
    "aoti": lambda run: bench_inductor(run, "aoti"),
    **{engine: functools.partial(bench_inductor, engine=engine) for engine in CUDA_ONLY},
}


# ---- the run ----


def step_figures(steps: dict[str, Any]) -> str:
    """One line of an engine's figures, logged as soon as it is done (a run cut short by a time
    limit still says what it measured)."""
    parts = []
    for step in STEPS:
        found = steps.get(step, {})
        if "error" in found:
            parts.append(f"{step} error")
        elif step == "latency" and "median_ms" in found:
            parts.append(f"latency {found['median_ms']:.3f} ms")
        elif "seconds" in found:
            parts.append(f"{step} {found['seconds']:.2f} s")
    return ", ".join(parts) or "nothing measured"


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


# Note: after each engine, `partial` gets the run so far, the engines not reached yet marked as
# such: `kiln bench` writes it to bench.json, so a run cut short (a time limit on a shared GPU
# machine, Ctrl-C) keeps the figures and kiln's compile profile it had measured.
NOT_REACHED = {"skipped": "not reached: the bench stopped before this engine"}


def run_bench(opts: BenchOptions, log: Callable[[str], None] = say,
              partial: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Every selected engine on one model; what bench.json holds. Engines left out by
    opts.engines are present with every step skipped."""
    config = load_config(opts.model)
    for build in KILN_BUILDS:  # an earlier run's: the other engines must not take its weights
        shutil.rmtree(opts.out / build, ignore_errors=True)
    opts.out.mkdir(parents=True, exist_ok=True)
    start = host_facts()  # the load average before this run adds its own
    with tempfile.TemporaryDirectory(prefix=f"kiln-bench-{config.name}-") as name:
        run = Run(opts, config, Path(name), opts.threads or None, log)
        probe = run.worker(run.spec("machine", "machine"), "machine")
        machine = {k: v for k, v in probe.items() if k not in ("process_s", "peak_rss_bytes")}
        threads = opts.threads or machine.get("threads")
        run = replace(run, threads=threads)
        head = {"model": config.name, "config": str(config.path), "target": opts.target,
                "machine": {**start, **machine}, "threads": threads, "runs": opts.runs,
                "warmup": opts.warmup, "recompiles": list(opts.recompiles)}
        listed = tuple(engine for engine in ENGINES if opts.target == "cuda" or engine not in CUDA_ONLY)
        engines = {engine: dict.fromkeys(STEPS, NOT_REACHED) for engine in listed}
        for engine in listed:  # kiln first: its build's weights are what the others run
            if engine in opts.engines:
                run.log(f"bench {config.name} ({opts.target}): {engine}")
                found = BENCHES[engine](run)
                engines[engine] = {step: found[step] for step in STEPS}
                run.log(f"  {engine}: {step_figures(engines[engine])}")
            else:
                engines[engine] = {step: {"skipped": "left out by --engines"} for step in STEPS}
            if partial is not None:
                partial({**head, "engines": dict(engines)})
    return {**head, "engines": engines}
