"""Items built ahead of their stage (pipeline/prebuild.py): a stand-in module for the process
handling, and link's runtime objects for the real thing."""

from __future__ import annotations

import os
import time
from pathlib import Path

from cache.store import Store
from pipeline.codedeps import stage_code_digest
from pipeline.prebuild import Prebuilds
from pipeline.stages import STAGES, Stage
from tasks.link import runtime

NO_CODE = lambda stage: ""  # noqa: E731
FAKE = (Stage("first", "a stage with nothing ahead", entry="m:f"),
        Stage("second", "a stage with an item ahead", entry="m:f", prebuild="tests.fake_prebuild"))


def _wait_for(path: Path) -> str:
    for _ in range(1200):
        try:
            if text := path.read_text():
                return text
        except OSError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"{path} was never written")


def _alive(pid: int) -> bool:
    try:
        return "zombie" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False


def test_a_build_still_running_when_the_compile_ends_is_killed_with_its_children(tmp_path: Path) -> None:
    ahead = Prebuilds(Store(tmp_path))
    ahead.start(FAKE, NO_CODE)
    child = int(_wait_for(tmp_path / "child.pid"))
    staging = tmp_path / "tmp" / f"link.items-0123456789abcdef-{ahead._running[0].proc.pid}-00000000"
    staging.mkdir(parents=True)  # what a killed build leaves: the store's cleanup does not run
    assert _alive(child)
    ahead.close()
    for _ in range(100):
        if not _alive(child):
            break
        time.sleep(0.05)
    assert not _alive(child)
    assert not list((tmp_path / "tmp").iterdir())  # its staging folder, and its log folder


def test_a_finished_build_is_named_in_its_stage_row_and_a_failed_one_is_not(tmp_path: Path) -> None:
    for status, note in (("0", "fake item built ahead"), ("3", ""), ("1", "")):  # built, found, failed
        (tmp_path / "status").write_text(status)
        ahead = Prebuilds(Store(tmp_path))
        ahead.start(FAKE, NO_CODE)
        ahead._running[0].proc.wait(timeout=120)
        assert ahead.note("second") == note
        assert ahead.note("first") == ""
        ahead.close()


def test_nothing_starts_for_an_item_already_cached_or_twice(tmp_path: Path) -> None:
    (tmp_path / "cached").touch()
    ahead = Prebuilds(Store(tmp_path))
    ahead.start(FAKE, NO_CODE)
    assert not ahead._running
    (tmp_path / "cached").unlink()
    ahead.start(FAKE, NO_CODE)  # once per compile
    assert not ahead._running


def test_the_runtime_is_built_ahead_once_and_link_finds_it(tmp_path: Path) -> None:
    store = Store(tmp_path)
    link = next(stage for stage in STAGES if stage.name == "link")
    assert link.entry is not None
    assert link.prebuild is not None
    code = stage_code_digest(f"{link.prebuild}:main")  # what the runner keys the runtime by
    assert not runtime.is_cached(store, code)
    ahead = Prebuilds(store)
    ahead.start((link,), lambda stage: code)
    ahead._running[0].proc.wait(timeout=300)
    assert ahead.note("link") == "runtime built ahead"
    ahead.close()
    assert runtime.is_cached(store, code)
    assert not runtime.is_cached(store, "another version of kiln's code")
    again = Prebuilds(store)
    again.start((link,), lambda stage: code)
    assert not again._running
    assert not os.listdir(tmp_path / "tmp")
