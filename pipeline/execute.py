"""Running one stage: in a worker process (the default) or in this process.

Note: a stage that runs goes to a fresh worker process. The runner itself never imports torch,
so a compile whose stages are all cached starts and finishes in well under a second; each
worker's peak RSS is that stage's own; and a stage that crashes (or is killed) takes only its
worker down, leaving the runner to report it and the cache untouched.
"""

from __future__ import annotations

import importlib
import json
import resource
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from cache.store import Store
from contract.config import ModelConfig
from contract.errors import KilnError
from contract.facts import env_fact
from contract.job import StageJob
from pipeline.stages import Stage
from pipeline.warm import WarmWorker, worker_env

Progress = Callable[[int, int, str], None]  # done, total, what: a long stage's progress

if TYPE_CHECKING:  # avoids an import cycle
    from pipeline.runner import BuildOptions

StageFn = Callable[[StageJob], Mapping[str, Any]]


@dataclass(frozen=True)
class Outcome:
    notes: dict[str, Any]
    peak_rss: int | None
    warnings: tuple[str, ...] = ()


def make_job(
    stage: Stage,
    config: ModelConfig,
    options: BuildOptions,
    inputs: dict[str, str],
    folder: Path,
    store: Store,
    code: str = "",
) -> StageJob:
    return StageJob(
        stage=stage.name,
        model=config.name,
        inputs=inputs,
        config={name: config.job_value(name) for name in stage.config},
        env={fact: env_fact(fact, options.target) for fact in stage.env},
        out=str(folder),
        project_root=str(config.project_root),
        store_root=str(store.root),
        entry=stage.entry or "",
        code=code,
        live=options.live,
        lease=str(store.lease.path) if store.lease is not None else "",
    )


def execute_stage(
    stage: Stage,
    config: ModelConfig,
    options: BuildOptions,
    inputs: dict[str, str],
    folder: Path,
    store: Store,
    on_progress: Progress | None = None,
    warm: WarmWorker | None = None,
    code: str = "",
) -> Outcome:
    """Run the stage: in this process, in `warm` (a worker started ahead of it) or in a fresh one."""
    job = make_job(stage, config, options, inputs, folder, store, code)
    if options.in_process or options.live is not None:
        notes = dict(load_entry(job.entry)(job))
        return Outcome(notes, peak_rss_self(), tuple(job.warnings))
    return _in_worker(stage, job, folder, on_progress, warm)


def load_entry(entry: str) -> StageFn:
    module_name, fn_name = entry.split(":")
    module = importlib.import_module(module_name)  # codedeps: a stage's entry, in that stage's key
    return cast(StageFn, getattr(module, fn_name))


def peak_rss_self() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _in_worker(stage: Stage, job: StageJob, folder: Path, on_progress: Progress | None,
               warm: WarmWorker | None) -> Outcome:
    control = folder.parent / f"{folder.name}.job"
    try:
        control.mkdir()
        job = replace(job, progress_file=str(control / "progress.json"))
        (control / "job.json").write_text(job.to_json())
        if warm is None:
            _spawn(control, on_progress)
            return _read_result(stage, control, control / "log.txt")
        _hand_over(warm, control, on_progress)
        return _read_result(stage, control, warm.log)
    except BaseException:
        if warm is not None and warm.proc.poll() is None:  # never handed over, or still running
            warm.proc.kill()
            warm.proc.wait()
        raise
    finally:
        shutil.rmtree(control, ignore_errors=True)


def _spawn(control: Path, on_progress: Progress | None) -> None:
    cmd = [sys.executable, "-m", "pipeline.worker", str(control)]
    with (control / "log.txt").open("wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=worker_env())
        _wait(proc, control, on_progress)


def _hand_over(warm: WarmWorker, control: Path, on_progress: Progress | None) -> None:
    """Give a waiting worker its control folder, then wait for it as for a fresh one."""
    assert warm.proc.stdin is not None
    try:
        warm.proc.stdin.write(f"{control}\n".encode())
        warm.proc.stdin.close()
    except OSError:  # it died just now: _read_result reports the crash with its log
        pass
    _wait(warm.proc, control, on_progress)


def _wait(proc: subprocess.Popen[bytes], control: Path, on_progress: Progress | None) -> None:
    try:
        while proc.poll() is None:
            try:
                proc.wait(timeout=0.25)
            except subprocess.TimeoutExpired:
                _relay_progress(control / "progress.json", on_progress)
    except BaseException:
        # Ctrl-C or a kill of the runner: take the worker down with us.
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        raise


def _relay_progress(path: Path, on_progress: Progress | None) -> None:
    if on_progress is None or not path.is_file():
        return
    try:
        done, total, what = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    on_progress(int(done), int(total), str(what))


def _read_result(stage: Stage, control: Path, log_file: Path) -> Outcome:
    try:
        result = json.loads((control / "result.json").read_text())
    except (OSError, ValueError):
        log = log_file.read_text(errors="replace")[-4000:]
        raise KilnError(
            f"stage {stage.name} crashed (its worker process died without a result)",
            "rerun with --debug to see its output",
        ).with_detail(log) from None
    if not result["ok"]:
        err = result["error"]
        raise KilnError(err["message"], err.get("hint", "")).with_detail(err.get("detail", ""))
    return Outcome(result["notes"], result["peak_rss"], tuple(result.get("warnings", ())))
