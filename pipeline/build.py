"""One compile, start to finish: open the cache, run the stages, publish the outputs and the
reports into the build folder (pipeline/publish.py) and remember what this build used (for gc
and explain)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from cache.leases import Lease
from cache.records import Records
from cache.store import Entry, Store
from contract.config import ModelConfig
from pipeline.progress import Display, QuietDisplay
from pipeline.publish import publish
from pipeline.report import report_files
from pipeline.runner import BuildOptions, BuildResult, Runner
from pipeline.stages import STAGES, Stage


def default_cache_root() -> Path:
    env = os.environ.get("KILN_CACHE_DIR")
    if env:
        return Path(env).expanduser().resolve()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "kiln"


@dataclass
class Cache:
    root: Path
    store: Store
    records: Records

    @classmethod
    def open(cls, root: Path, display: Display | None = None) -> Cache:
        warn = (display or QuietDisplay()).warn
        root = root.absolute()  # the store's folders are named from it, and compilers run elsewhere
        return cls(root, Store(root / "store", warn=warn), Records(root / "records", warn=warn))


def compile_model(
    config: ModelConfig,
    options: BuildOptions,
    cache: Cache,
    display: Display | None = None,
    stages: tuple[Stage, ...] = STAGES,
) -> BuildResult:
    display = display or QuietDisplay()
    warnings: list[str] = []

    def warn(message: str) -> None:
        warnings.append(message)
        display.warn(message)

    cache.store.warn = cache.records.warn = warn
    # Note: the lease holds every entry this compile looks up or writes, from lookup to publish,
    # so a gc or clear beside it never deletes them (cache/leases.py).
    cache.store.lease = Lease.open(cache.store.root)
    try:
        runner = Runner(config, options, cache.store, cache.records, display, stages)
        result = runner.run()
        result.warnings = warnings
        publish(result, stages, lambda: report_files(result))
        remember_build(cache.records, runner.id, result.entries)
    finally:
        cache.store.lease.close()
        cache.store.lease = None
    return result


def remember_build(records: Records, build: str, entries: dict[str, Entry]) -> None:
    now = time.time()
    used = [f"{e.stage}/{e.key}" for e in entries.values()]
    # Note: a stage that caches per item (autotune, per kernel) lists the items it used, so gc
    # keeps them with the build that needs them.
    for e in entries.values():
        used += [str(item) for item in e.meta.get("notes", {}).get("items", [])]
    records.set("build", build, {"time": now, "entries": used})
    for name in used:
        records.set("use", name, now)
