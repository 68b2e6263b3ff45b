"""The runner: a topological loop over the stage table with content keys, early cutoff, a
per-key file lock and atomic writes.

Note: not pydra. Measured here (DESIGN §7), pydra spends 5-26 ms of engine time per task and
its hashes drift across runs; this chain is static, so the loop below is all the engine kiln
needs. Fan-out inside a stage uses cache.items.ItemCache, one key per item.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cache.locks import key_lock
from cache.records import Records
from cache.store import Artifact, Entry, Store, scan_artifacts
from contract.config import ModelConfig
from contract.errors import KilnError
from contract.facts import env_fact, machine_facts
from contract.job import StageJob
from contract.keys import KeyContext, Parts
from pipeline.codedeps import stage_code_digest
from pipeline.executor import Executor, executor_for
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
        self.entries: dict[str, Entry] = {}
        self.touched: set[str] = set()  # stages that ran, or were cut off below one that ran
        self._t0 = 0.0
        self.executor: Executor = executor_for(
            store, options.target, self.code, in_process=options.in_process, live=options.live is not None)

    def run(self) -> BuildResult:
        self._check_stage_names()
        self._t0 = time.perf_counter()
        rows: list[StageRow] = []
        blocked = ""
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
                rows.append(self._stage(stage))
                if rows[-1].status == "ran":
                    rows[-1].note = "; ".join(filter(None, [rows[-1].note, self.executor.note(stage.name)]))
                if stage.name == self.options.until:
                    blocked = f"--until {stage.name}"
        finally:
            self.executor.close()
        seconds = time.perf_counter() - self._t0
        result = BuildResult(self.config.name, self.options.target, self.options.out, rows)
        result.entries, result.seconds = dict(self.entries), seconds
        return result

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
        parts = static_parts(stage, self.config, self.options.target, digests, self.records)
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

    def _stage(self, stage: Stage) -> StageRow:
        start = time.perf_counter()
        forced = stage.name in self.options.force
        parts, key, entry = self.probe(stage, forced=forced)
        status = "hit"
        if entry is None:
            entry, status, rss = self._compute(stage, parts, key, forced)
        else:
            rss = None
        # Note: "cutoff" marks a stage spared by early cutoff: something above it reran (it
        # may be several stages up) but wrote the same bytes, so this key did not change.
        if status == "hit" and any(up in self.touched for up in stage.upstream):
            status = "cutoff"
        if status in ("ran", "cutoff"):
            self.touched.add(stage.name)
        self.entries[stage.name] = entry
        self.records.set("parts", f"{self.id}/{stage.name}", dict(entry.meta.get("parts", parts)))
        seconds = time.perf_counter() - start
        summary = str(entry.meta.get("notes", {}).get("summary", ""))
        row = StageRow(stage.name, status, seconds, entry.size, rss, entry.key, start - self._t0, summary)
        self.display.finished(row.stage, row.status, row.seconds)
        return row

    def _compute(
        self, stage: Stage, parts: Parts | None, key: str, forced: bool
    ) -> tuple[Entry, str, int | None]:
        if parts is None:
            # Note: nothing to wait for or find: the key is the output's, known after the run.
            return self._start_and_execute(stage, parts, key)
        lock = self.store.root / "locks" / f"{stage.name}-{key}.lock"
        with key_lock(lock, on_wait=lambda: self.display.waiting(stage.name)):
            if not forced:
                # Note: another process may have computed this key while we waited for the
                # lock; and for a stage with dynamic parts (trace's depfile) it may have
                # recorded what it read, so the parts are computed afresh.
                parts, key, entry = self.probe(stage)
                if entry is not None:
                    return entry, "hit", None
            return self._start_and_execute(stage, parts, key)

    def _start_and_execute(self, stage: Stage, parts: Parts | None,
                           key: str) -> tuple[Entry, str, int | None]:
        self.display.started(stage.name)
        return self._execute(stage, parts, key)

    def _execute(self, stage: Stage, parts: Parts | None, key: str) -> tuple[Entry, str, int | None]:
        inputs = {}
        for ref in stage.reads:
            entry, name = self._artifact(ref)
            inputs[ref] = str(entry.file(name))
        with self.store.staging(stage.name, key or "unkeyed") as folder:
            t0 = time.perf_counter()
            def progress(done: int, total: int, what: str) -> None:
                self.display.progress(stage.name, done, total, what)

            outcome = self.executor.run(self._job(stage, inputs, folder), progress)
            seconds = time.perf_counter() - t0
            for warning in outcome.warnings:
                self.store.warn(warning)
            dyn = dynamic_keys(stage)
            artifacts = None
            if dyn is not None:
                # Note: the stage just told us what it read (its depfile); the entry is filed
                # under the key computed from that, which is what the next build computes. A
                # stage keyed by its output has its files hashed once, here, for both.
                dyn.remember(self.ctx, outcome.notes)
                artifacts = scan_artifacts(folder) if parts is None else None
                parts = self.parts(stage, outputs=artifacts)
                assert parts is not None
                key = key_of(parts)
            meta = {
                "parts": parts,
                "notes": outcome.notes,
                "seconds": round(seconds, 3),
                "peak_rss": outcome.peak_rss,
            }
            entry = self.store.commit(folder, stage.name, key, meta, artifacts)
        return entry, "ran", outcome.peak_rss

    def _job(self, stage: Stage, inputs: dict[str, str], folder: Path) -> StageJob:
        """What the stage receives (contract/job.py): only what it declared, facts measured here."""
        return StageJob(
            stage=stage.name,
            model=self.config.name,
            inputs=inputs,
            config={name: self.config.job_value(name) for name in stage.config},
            env={fact: env_fact(fact, self.options.target) for fact in stage.env},
            out=str(folder),
            project_root=str(self.config.project_root),
            store_root=str(self.store.root),
            entry=stage.entry_for(self.options.target) or "",
            code=self.code(stage),
            target=self.options.target,
            machine=self.machine,
            live=self.options.live,
            lease=str(self.store.lease.path) if self.store.lease is not None else "",
        )
