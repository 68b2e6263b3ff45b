"""How a stage's job gets run: the Executor interface the runner drives, the in-process
executor, and the choice between executors.

The runner knows keys, the cache and the order of stages; an executor knows only how to run a
job. Before each stage the runner calls prepare(upcoming) with the stages the build may still
run, the one it is at first; for each stage it must compute it calls run(job); at the end,
close(). What an executor does ahead of time (a worker started for the next stage, an item
built beside the current one) hangs off those calls and never changes a result, only when it
is ready. A cluster executor (Slurm) is one more implementation of the same four methods.

Note: note(stage) is the fourth method, beside the three the design named: what the executor
did ahead for a stage ("kiln runtime built ahead") belongs in that stage's report row, and only
the executor knows it. launch(job) is run(job) in two halves: the job is handed over at once (on
the runner's thread, which alone touches what the executor holds), and its Launch is waited for
later, from any thread. An executor whose stages run in processes of their own `overlaps`: the
runner may wait for a stage beside the chain (weights) while the stages after it run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from cache.store import Store
from contract.job import StageJob
from pipeline.prebuild import Prebuilds
from pipeline.stages import Stage
from pipeline.worker import run_stage, stage_peak_rss

Progress = Callable[[int, int, str], None]  # done, total, what: a long stage's progress
CodeDigest = Callable[[Stage], str]  # a stage's code digest: the key of the items it makes


@dataclass(frozen=True)
class Outcome:
    notes: dict[str, Any]
    peak_rss: int | None
    warnings: tuple[str, ...] = ()
    served: bool = False  # ran in a worker the stage server forked (pipeline/server.py)


@dataclass(frozen=True)
class Launch:
    """A job handed to an executor: wait(on_progress) runs or waits for it to its end (from any
    thread); cancel() makes a wait still in progress stop, killing its worker, and raise."""

    wait: Callable[[Progress | None], Outcome]
    cancel: Callable[[], None] = lambda: None


class Executor(Protocol):
    def prepare(self, upcoming: tuple[Stage, ...]) -> None:
        """The stages this build may still run, in order, the one the runner is at first. What
        was prepared for a stage no longer among them (found in the cache) is dropped."""

    overlaps: bool  # a Launch's wait may run while the runner launches further stages

    def run(self, job: StageJob, on_progress: Progress | None = None) -> Outcome:
        """Run the stage's job to its end; its artifacts are in job.out_dir after it."""

    def launch(self, job: StageJob) -> Launch:
        """Hand the stage's job over; its Launch is waited for later (run is launch, then wait)."""

    def note(self, stage: str) -> str:
        """What this executor did ahead for the stage, for its report row ("" for nothing)."""

    def close(self) -> None:
        """Stop whatever is still running ahead; nothing it started outlives the build."""


class InProcessExecutor:
    """Every stage in this process (--in-process, and compile() of an in-memory module, whose
    module cannot cross into a worker). Items are still built ahead in their own processes,
    unless `ahead` is None. A launched job runs when it is waited for: nothing overlaps here."""

    overlaps = False

    def __init__(self, ahead: Prebuilds | None = None, code: CodeDigest | None = None) -> None:
        self.upcoming: tuple[Stage, ...] = ()
        self._ahead = ahead
        self._code = code or (lambda stage: "")

    def prepare(self, upcoming: tuple[Stage, ...]) -> None:
        self.upcoming = upcoming

    def run(self, job: StageJob, on_progress: Progress | None = None) -> Outcome:
        self.start_ahead()
        return Outcome(run_stage(job), stage_peak_rss(), tuple(job.warnings))

    def launch(self, job: StageJob) -> Launch:
        return Launch(lambda on_progress: self.run(job, on_progress))

    def start_ahead(self) -> None:
        """The builds ahead for the stages after the one about to run: started by the first stage
        that runs, so a no-op recompile starts nothing and looks nothing up."""
        if self._ahead is not None:
            self._ahead.start(self.upcoming[1:], self._code)

    def note(self, stage: str) -> str:
        return self._ahead.note(stage) if self._ahead is not None else ""

    def close(self) -> None:
        if self._ahead is not None:
            self._ahead.close()


def executor_for(store: Store, target: str, code: CodeDigest, *, in_process: bool, live: bool,
                 scope: str = "") -> Executor:
    """in_process: every stage here, nothing ahead; live (an in-memory module): every stage here,
    items still built ahead; else each stage in a worker, the next one's started ahead."""
    if in_process:
        return InProcessExecutor()
    if live:
        return InProcessExecutor(Prebuilds(store), code)
    from pipeline.workers import WarmWorkerExecutor

    return WarmWorkerExecutor(store, target, code, scope)
