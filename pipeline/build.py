"""One compile, start to finish: open the cache, run the stages, publish the outputs into the
build folder, write the reports and remember what this build used (for gc and explain)."""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from cache.records import Records
from cache.store import Entry, Store
from pipeline.config import ModelConfig
from pipeline.progress import Display, QuietDisplay
from pipeline.report import write_reports
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
        return cls(root, Store(root / "store", warn=warn), Records(root / "records"))


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

    cache.store.warn = warn
    runner = Runner(config, options, cache.store, cache.records, display, stages)
    result = runner.run()
    result.warnings = warnings
    publish(result, stages)
    write_reports(result)
    remember_build(cache.records, runner.id, result.entries)
    return result


def publish(result: BuildResult, stages: tuple[Stage, ...]) -> None:
    """Hard-link (or copy) each stage's published artifacts into the build folder.

    Note: cache files are read-only and checked against their digests, so a hard link is safe:
    a tool that rewrites the build copy changes the cache file's stamp and the next compile
    re-verifies it and recomputes the entry instead of trusting it.
    """
    result.out.mkdir(parents=True, exist_ok=True)
    for stage in stages:
        entry = result.entries.get(stage.name)
        if entry is None:
            continue
        for name in stage.publish:
            names = [a for a in entry.artifacts if a.startswith(name)] if name.endswith("/") else [name]
            for artifact in names:
                (result.out / artifact).parent.mkdir(parents=True, exist_ok=True)
                _link(entry.file(artifact), result.out / artifact)


def _link(src: Path, dst: Path) -> None:
    try:
        if dst.exists() and os.path.samefile(src, dst):
            return
    except OSError:
        pass
    tmp = dst.with_name(f".{dst.name}.{os.getpid()}")
    tmp.unlink(missing_ok=True)
    try:
        os.link(src, tmp)
    except OSError:
        shutil.copyfile(src, tmp)
    tmp.replace(dst)


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
