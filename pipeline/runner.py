"""The runner: a topological loop over the stage table with content keys, early cutoff, a
per-key file lock and atomic writes.

Note: not pydra. Measured here (DESIGN §7), pydra spends 5-26 ms of engine time per task and
its hashes drift across runs; this chain is static, so the loop below is all the engine kiln
needs. Fan-out inside a stage uses cache.items.ItemCache, one key per item.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cache.locks import key_lock
from cache.records import Records
from cache.store import Artifact, Entry, Store, scan_artifacts
from contract.config import ModelConfig
from contract.errors import KilnError
from contract.executor_settings import resolve as resolve_executor
from contract.executor_settings import tuning_gpu
from contract.facts import env_fact, machine_facts
from contract.job import StageJob
from contract.keys import KeyContext, Parts
from pipeline.codedeps import stage_code_digest
from pipeline.executor import Executor, Launch, Outcome, executor_for
from pipeline.keys import dynamic_keys, key_of, output_parts, static_parts
from pipeline.progress import Display
from pipeline.stages import STAGES, Stage


@dataclass(frozen=True)
class BuildOptions:
    target: str
    out: Path
    force: frozenset[str] = frozenset()
    until: str | None = None
    in_process: bool = False
    live: Any = None  # an in-memory model (pipeline.compile); forces in-process trace
    executor: str | None = None  # where per-kernel work runs (local, slurm); None: $KILN_EXECUTOR


@dataclass
class StageRow:
    """One row of the compile report."""

    stage: str
    status: str  # ran | hit | cutoff | not built | skipped
    seconds: float = 0.0
    bytes: int = 0
    peak_rss: int | None = None
    key: str = ""
    start: float = 0.0
    note: str = ""
    beside: bool = False  # ran beside the chain (weights), overlapping the stages after it
    served: bool = False  # ran in a worker the stage server forked, its imports done (pipeline/server.py)

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class BuildResult:
    model: str
    target: str
    out: Path
    rows: list[StageRow]
    entries: dict[str, Entry] = field(default_factory=dict)
    seconds: float = 0.0
    warnings: list[str] = field(default_factory=list)


@dataclass
class _Begun:
    """A stage the runner is at: found in the cache (entry), or its job launched (launch), with
    the key lock and staging folder it holds until it is finished."""

    stage: Stage
    start: float
    parts: Parts | None = None
    key: str = ""
    entry: Entry | None = None
    launch: Launch | None = None
    launched: float = 0.0
    folder: Path | None = None
    outcome: Outcome | None = None
    scanned: dict[str, Artifact] | None = None  # its files' digests, where the waiter hashed them
    closing: contextlib.ExitStack[Any] = field(default_factory=contextlib.ExitStack)


def build_id(config: ModelConfig, target: str) -> str:
    return f"{config.path}::{target}"


class Runner:
    def __init__(
        self,
        config: ModelConfig,
        options: BuildOptions,
        store: Store,
        records: Records,
        display: Display,
        stages: tuple[Stage, ...] = STAGES,
    ) -> None:
        self.config = config
        self.options = options
        self.store = store
        self.records = records
        self.display = display
        self.stages = stages
        self.id = build_id(config, options.target)
        self.ctx = KeyContext(config, records, self.id, options.live)
        # where per-kernel work runs: checked before any stage runs (bad settings fail at once)
        self.where = resolve_executor(options.executor, config.executor)
        if options.target == "cuda":
            tuning_gpu(self.where)  # a cluster's GPU must be named before trace runs, not after
        self.entries: dict[str, Entry] = {}
        self.touched: set[str] = set()  # stages that ran, or were cut off below one that ran
        self._t0 = 0.0
        # Note: the stage server's scope is the model's code, not its config (pipeline/server.py)
        scope = f"{config.project_root}:{config.field('model.factory')}"
        self.executor: Executor = executor_for(store, options.target, self.code, scope=scope,
                                               in_process=options.in_process, live=options.live is not None)

    def run(self) -> BuildResult:
        self._check_stage_names()
        self._t0 = time.perf_counter()
        rows: list[StageRow] = []
        beside: list[tuple[int, _Begun, Future[float]]] = []  # row index, stage, its end time
        blocked = ""
        with ThreadPoolExecutor(max_workers=len(self.stages), thread_name_prefix="kiln-beside") as waiter:
            try:
                for stage in self.stages:
                    if blocked:
                        rows.append(StageRow(stage.name, "skipped", note=blocked))
                        continue
                    if not stage.built_for(self.options.target):
                        rows.append(StageRow(stage.name, "not built", note=f"planned: {stage.planned}"))
                        blocked = f"needs {stage.name}"
                        continue
                    self.executor.prepare((stage, *self._still_to_come(stage)))
                    # Note: a stage that times code (autotune) has the machine to itself: a
                    # weights stage still running would skew measurements the cache then keeps.
                    self._finish_beside(beside, rows, all_of_them=stage.measures_on(self.options.target))
                    begun = self._begin(stage)
                    if begun.launch is not None and self._beside_the_chain(stage):
                        rows.append(StageRow(stage.name, "running", beside=True))
                        beside.append((len(rows) - 1, begun, waiter.submit(self._wait_beside, begun)))
                    else:
                        rows.append(self._finish(begun, None))
                    self._finish_beside(beside, rows, all_of_them=False)
                    if stage.name == self.options.until:
                        blocked = f"--until {stage.name}"
                self._finish_beside(beside, rows, all_of_them=True)
            finally:
                for _, begun, ended in beside:  # the chain failed or was interrupted: stop them
                    self._stop_beside(begun, ended)
                self.executor.close()
        seconds = time.perf_counter() - self._t0
        result = BuildResult(self.config.name, self.options.target, self.options.out, rows)
        result.entries, result.seconds = dict(self.entries), seconds
        return result

    def _beside_the_chain(self, stage: Stage) -> bool:
        """Whether the stage runs beside the stages after it: no later stage reads it (weights,
        which only the build folder takes) and the executor runs stages in processes of their own.

        Note: the weights file is the model's values, which no stage below trace reads (the
        program's key covers names, shapes and dtypes); waiting for it before lower put its
        seconds (the seeded init of a transformers model: ~4 s of bert-small's 24) on every
        compile's critical path. The build waits for it at the end, before the folder is published."""
        later = self.stages[self.stages.index(stage) + 1:]
        return self.executor.overlaps and bool(later) and all(stage.name not in s.upstream for s in later)

    def _finish_beside(self, beside: list[tuple[int, _Begun, Future[float]]], rows: list[StageRow], *,
                       all_of_them: bool) -> None:
        """Finish the stages beside the chain: all of them (waiting), or those that already ended
        well (so their key locks are not held while the chain goes on; one that failed is
        raised only after the chain, whose entries are kept)."""
        for item in list(beside):
            index, begun, ended = item
            if all_of_them or (ended.done() and ended.exception() is None):
                rows[index] = self._finish(begun, ended)
                beside.remove(item)

    @staticmethod
    def _wait_beside(begun: _Begun) -> float:
        """On the waiter thread: wait for the stage's worker and hash what it wrote (pure file
        work, so its row counts it); when that ended."""
        assert begun.launch is not None
        assert begun.folder is not None
        begun.outcome = begun.launch.wait(None)
        begun.scanned = scan_artifacts(begun.folder)
        return time.perf_counter()

    def _following(self, stage: Stage) -> Stage | None:
        """The stage after this one, if this build may run it."""
        if stage.name == self.options.until:
            return None
        index = self.stages.index(stage)
        after = self.stages[index + 1] if index + 1 < len(self.stages) else None
        return after if after is not None and after.built_for(self.options.target) else None

    def _still_to_come(self, stage: Stage) -> tuple[Stage, ...]:
        """The stages after this one that this build may run."""
        coming: list[Stage] = []
        after = self._following(stage)
        while after is not None:
            coming.append(after)
            after = self._following(after)
        return tuple(coming)

    def _check_stage_names(self) -> None:
        names = {s.name for s in self.stages}
        for name in [*self.options.force, *([self.options.until] if self.options.until else [])]:
            if name not in names:
                raise KilnError(f"unknown stage {name!r}", f"stages: {', '.join(names)}")

    def _artifact(self, ref: str) -> tuple[Entry, str]:
        """The entry and artifact name a "stage/artifact" reference points at."""
        stage, name = ref.split("/", 1)
        return self.entries[stage], name

    def parts(self, stage: Stage, outputs: Mapping[str, Artifact] | None = None) -> Parts | None:
        """The stage's key parts; None for a stage whose key is known only once it has run
        (its dynamic parts say so), until `outputs`, the files it wrote, are given."""
        digests = {}
        for ref in stage.reads:
            entry, name = self._artifact(ref)
            digests[ref] = entry.artifacts[name].digest
        parts = static_parts(stage, self.config, self.options.target, digests, self.records, self.where)
        dyn = dynamic_keys(stage)
        if dyn is not None:
            extra = dyn.key_parts(self.ctx)
            if extra is None:
                if outputs is None:
                    return None
                extra = output_parts(outputs)
            parts.update(extra)
        return parts

    @functools.cached_property
    def machine(self) -> dict[str, int]:
        """The machine's cores and GPUs (contract.facts), measured when the first job is made:
        a no-op recompile or an explain makes none and measures nothing."""
        return machine_facts(self.options.target)

    def code(self, stage: Stage) -> str:
        """The digest of the code that makes the stage's items (StageJob.code, their key part).

        Note: a stage that builds an item ahead (Stage.prebuild: link's runtime objects) makes it
        with that module, so the item is keyed by that module's closure alone, the same for
        every target; else by all the code the stage runs (autotune's kernel records)."""
        entry = f"{stage.prebuild}:main" if stage.prebuild else stage.entry_for(self.options.target)
        return stage_code_digest(entry, scans=self.records) if entry else ""

    def probe(self, stage: Stage, *, forced: bool = False) -> tuple[Parts | None, str, Entry | None]:
        """The stage's key parts, its key and its cached entry (None if missing or forced);
        no parts and no key for a stage that must run to know its key."""
        parts = self.parts(stage)
        if parts is None:
            return None, "", None
        key = key_of(parts)
        return parts, key, None if forced else self.store.lookup(stage.name, key)

    def _begin(self, stage: Stage) -> _Begun:
        """The stage found in the cache, or its job launched under its key's lock (held, with
        its staging folder, until _finish)."""
        begun = _Begun(stage, time.perf_counter())
        forced = stage.name in self.options.force
        begun.parts, begun.key, begun.entry = self.probe(stage, forced=forced)
        if begun.entry is not None:
            return begun
        try:
            if begun.parts is not None:
                # Note: for a stage keyed by its output (parts None) there is nothing to wait
                # for or find: the key is known after the run.
                lock = self.store.root / "locks" / f"{stage.name}-{begun.key}.lock"
                begun.closing.enter_context(key_lock(lock, on_wait=lambda: self.display.waiting(stage.name)))
                if not forced:
                    # Note: another process may have computed this key while we waited for the
                    # lock; and for a stage with dynamic parts (trace's depfile) it may have
                    # recorded what it read, so the parts are computed afresh.
                    begun.parts, begun.key, begun.entry = self.probe(stage)
                    if begun.entry is not None:
                        begun.closing.close()
                        return begun
            self.display.started(stage.name)
            inputs = {}
            for ref in stage.reads:
                entry, name = self._artifact(ref)
                inputs[ref] = str(entry.file(name))
            begun.folder = begun.closing.enter_context(self.store.staging(stage.name, begun.key or "unkeyed"))
            begun.launched = time.perf_counter()
            begun.launch = self.executor.launch(self._job(stage, inputs, begun.folder))
        except BaseException:
            begun.closing.close()
            raise
        return begun

    def _finish(self, begun: _Begun, ended: Future[float] | None) -> StageRow:
        """The stage's row, once its job (if launched) has ended and its entry is committed;
        `ended`: the waiter's future for a stage that ran beside the chain."""
        stage, status, rss = begun.stage, "hit", None
        end: float | None = None
        if begun.launch is not None:
            if ended is not None:
                end = self._ended(begun, ended)
            with begun.closing:
                if ended is None:
                    begun.outcome = begun.launch.wait(
                        lambda done, total, what: self.display.progress(stage.name, done, total, what))
                begun.entry = self._commit(begun, (end or time.perf_counter()) - begun.launched)
            status, rss = "ran", begun.outcome.peak_rss if begun.outcome is not None else None
        entry = begun.entry
        assert entry is not None
        # Note: "cutoff" marks a stage spared by early cutoff: something above it reran (it
        # may be several stages up) but wrote the same bytes, so this key did not change.
        if status == "hit" and any(up in self.touched for up in stage.upstream):
            status = "cutoff"
        if status in ("ran", "cutoff"):
            self.touched.add(stage.name)
        self.entries[stage.name] = entry
        self.records.set("parts", f"{self.id}/{stage.name}", dict(entry.meta.get("parts", begun.parts)))
        seconds = (end or time.perf_counter()) - begun.start
        summary = str(entry.meta.get("notes", {}).get("summary", ""))
        served = status == "ran" and begun.outcome is not None and begun.outcome.served
        row = StageRow(stage.name, status, seconds, entry.size, rss, entry.key, begun.start - self._t0,
                       summary, beside=ended is not None, served=served)
        self.display.finished(row.stage, row.status, row.seconds)
        if status == "ran":
            row.note = "; ".join(filter(None, [row.note, self.executor.note(stage.name)]))
        return row

    @staticmethod
    def _ended(begun: _Begun, ended: Future[float]) -> float:
        """When a stage beside the chain ended. Its lock and staging folder are let go only once
        its worker has stopped: an interrupt here cancels the worker and waits for it first."""
        try:
            return ended.result()
        except BaseException:
            Runner._stop_beside(begun, ended)
            raise

    @staticmethod
    def _stop_beside(begun: _Begun, ended: Future[float]) -> None:
        """Stop a stage beside the chain (its worker killed, if it still runs), then let go of
        its key lock and staging folder: in that order, so no other build takes the key while
        the worker still writes."""
        assert begun.launch is not None
        begun.launch.cancel()
        wait([ended])
        begun.closing.close()

    def _commit(self, begun: _Begun, seconds: float) -> Entry:
        """The ended job's folder sealed as the stage's entry, under the key it ends with."""
        stage, outcome, folder = begun.stage, begun.outcome, begun.folder
        assert outcome is not None
        assert folder is not None
        for warning in outcome.warnings:
            self.store.warn(warning)
        parts, key = begun.parts, begun.key
        dyn = dynamic_keys(stage)
        artifacts = begun.scanned  # hashed already by the waiter, for a stage beside the chain
        if dyn is not None:
            # Note: the stage just told us what it read (its depfile); the entry is filed
            # under the key computed from that, which is what the next build computes. A
            # stage keyed by its output has its files hashed once, here, for both.
            dyn.remember(self.ctx, outcome.notes)
            if parts is None and artifacts is None:
                artifacts = scan_artifacts(folder)
            parts = self.parts(stage, outputs=artifacts if parts is None else None)
            assert parts is not None
            key = key_of(parts)
        meta = {"parts": parts, "notes": outcome.notes, "seconds": round(seconds, 3),
                "peak_rss": outcome.peak_rss}
        return self.store.commit(folder, stage.name, key, meta, artifacts)

    def _job(self, stage: Stage, inputs: dict[str, str], folder: Path) -> StageJob:
        """What the stage receives (contract/job.py): only what it declared, facts measured here."""
        return StageJob(
            stage=stage.name,
            model=self.config.name,
            inputs=inputs,
            config={name: self.config.job_value(name) for name in stage.config},
            env={fact: env_fact(fact, self.options.target, self.where) for fact in stage.env},
            out=str(folder),
            project_root=str(self.config.project_root),
            store_root=str(self.store.root),
            entry=stage.entry_for(self.options.target) or "",
            code=self.code(stage),
            target=self.options.target,
            machine=self.machine,
            executor=self.where,
            live=self.options.live,
            lease=str(self.store.lease.path) if self.store.lease is not None else "",
        )
