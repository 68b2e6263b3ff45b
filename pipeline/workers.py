"""The worker-process executors: each stage in a fresh worker process, or (the default) in a
worker started ahead of it while the stage before it ran (pipeline/warm.py).

Note: a stage that runs goes to a worker process. The runner itself never imports torch, so a
compile whose stages are all cached starts and finishes in well under a second; each worker's
peak RSS is that stage's own; and a stage that crashes (or is killed) takes only its worker
down, leaving the runner to report it and the cache untouched.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import threading
from dataclasses import replace
from pathlib import Path

from cache.store import Store
from contract.errors import KilnError
from contract.job import StageJob
from pipeline import server
from pipeline.executor import CodeDigest, InProcessExecutor, Launch, Outcome, Progress
from pipeline.prebuild import Prebuilds
from pipeline.stages import Stage
from pipeline.warm import Proc, WarmWorker, WarmWorkers, start_worker, worker_env


class WorkerExecutor(InProcessExecutor):
    """Each stage in a fresh worker process; items built ahead as in process."""

    overlaps = True

    def __init__(self, store: Store, code: CodeDigest, scope: str = "") -> None:
        super().__init__(Prebuilds(store), code)
        self.ran = False  # whether any stage ran in a worker
        self.scope = scope  # the stage server's: the model's project and factory (pipeline/server.py)

    def run(self, job: StageJob, on_progress: Progress | None = None) -> Outcome:
        return self.launch(job).wait(on_progress)

    def launch(self, job: StageJob) -> Launch:
        self.start_ahead()
        if self.upcoming and self.upcoming[0].measures_on(job.target):  # not beside the server's imports
            server.wait_quiet(worker_env(), job.target, self.scope)
        self.ran = True
        warm = self.take_warm(job.stage)
        stop = threading.Event()
        job = replace(job, libraries_file=self.libraries_file())
        return Launch(lambda on_progress: run_in_worker(job, on_progress, warm, stop, self.scope), stop.set)

    def take_warm(self, stage: str) -> WarmWorker | None:
        return None

    def libraries_file(self) -> str:
        """Where a stage that builds the model lists its libraries for workers waiting ("": none)."""
        return ""


class WarmWorkerExecutor(WorkerExecutor):
    """Each stage in a worker started while the stage before it ran, its imports done."""

    def __init__(self, store: Store, target: str, code: CodeDigest, scope: str = "") -> None:
        super().__init__(store, code, scope)
        self.pool = WarmWorkers(target, store.tmp, scope)

    def prepare(self, upcoming: tuple[Stage, ...]) -> None:
        super().prepare(upcoming)
        self.pool.keep_only({stage.name for stage in upcoming})

    def take_warm(self, stage: str) -> WarmWorker | None:
        for ahead in starting_next(self.upcoming):
            self.pool.start(ahead)
        return self.pool.take(stage)

    def libraries_file(self) -> str:
        return str(self.pool.libraries)

    def close(self) -> None:
        super().close()
        self.pool.close()
        if self.ran:  # the next compile's workers are forked from it (pipeline/server.py)
            server.start(worker_env(), self.pool.target, self.scope)


def starting_next(upcoming: tuple[Stage, ...]) -> tuple[Stage, ...]:
    """The stages that may start as soon as upcoming[0] ends: the next one, and where that one
    runs beside the chain (no stage after it reads it: weights), the one after it as well.

    Note: one worker ahead was the next stage's alone. After trace that is weights, and lower,
    launched a moment after weights, found no worker ready and paid its imports (2.3 s of a
    3.5 s lower of bert here) on the critical path."""
    ahead: list[Stage] = []
    for index, stage in enumerate(upcoming[1:], start=1):
        ahead.append(stage)
        if any(stage.name in later.upstream for later in upcoming[index + 1:]) or index + 1 == len(upcoming):
            break
    return tuple(ahead)


def run_in_worker(job: StageJob, on_progress: Progress | None, warm: WarmWorker | None = None,
                  stop: threading.Event | None = None, scope: str = "") -> Outcome:
    """Run the job in `warm` (a worker started ahead of it) or in a fresh worker process; once
    `stop` is set, the worker is killed and the stage is a KilnError."""
    return _in_worker(job, job.out_dir, on_progress, warm, stop, scope)


def _in_worker(job: StageJob, folder: Path, on_progress: Progress | None,
               warm: WarmWorker | None, stop: threading.Event | None, scope: str) -> Outcome:
    control = folder.parent / f"{folder.name}.job"
    try:
        control.mkdir()
        learn = server.learn_file(worker_env(), job.target, scope)
        job = replace(job, progress_file=str(control / "progress.json"), learn_file=str(learn or ""))
        (control / "job.json").write_text(job.to_json())
        if warm is None:
            warm = start_worker(job.entry, job.target, control / "log.txt", scope)
        warm.hand_over(control)
        _wait(warm.proc, control, on_progress, stop)
        return _read_result(job.stage, control, warm.log)
    except BaseException:
        if warm is not None and warm.proc.poll() is None:  # never handed over, or still running
            warm.proc.kill()
            warm.proc.wait()
        raise
    finally:
        shutil.rmtree(control, ignore_errors=True)


def _wait(proc: Proc, control: Path, on_progress: Progress | None, stop: threading.Event | None) -> None:
    try:
        while proc.poll() is None:
            if stop is not None and stop.is_set():
                raise KilnError("stage cancelled: the build stopped while it ran")
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


def _read_result(stage: str, control: Path, log_file: Path) -> Outcome:
    try:
        result = json.loads((control / "result.json").read_text())
    except (OSError, ValueError):
        log = log_file.read_text(errors="replace")[-4000:]
        raise KilnError(
            f"stage {stage} crashed (its worker process died without a result)",
            "rerun with --debug to see its output",
        ).with_detail(log) from None
    if not result["ok"]:
        err = result["error"]
        raise KilnError(err["message"], err.get("hint", "")).with_detail(err.get("detail", ""))
    return Outcome(result["notes"], result["peak_rss"], tuple(result.get("warnings", ())),
                   bool(result.get("served")))
