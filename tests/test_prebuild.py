"""Items built ahead of their stage (pipeline/prebuild.py), with a stand-in module; the real
runtime build ahead is checked by test_cli.py's compile."""

from __future__ import annotations

import os
import time
from pathlib import Path

from cache.store import Store
from pipeline.prebuild import Prebuilds
from pipeline.stages import Stage

STAGES = (Stage("first", "a stage with nothing ahead", entry="m:f"),
          Stage("second", "a stage with an item ahead", entry="m:f", prebuild="tests.fake_prebuild"),
          Stage("third", "not built for cpu", entry="m:f", targets=("cuda",), prebuild="tests.fake_prebuild"))


def _wait_for(path: Path) -> str:
    for _ in range(200):
        if path.exists() and path.read_text():
            return path.read_text()
        time.sleep(0.05)
    raise AssertionError(f"{path} was never written")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text()


def test_a_build_still_running_when_the_compile_ends_is_killed_with_its_children(tmp_path: Path) -> None:
    ahead = Prebuilds(Store(tmp_path))
    ahead.start(STAGES, "cpu")
    child = int(_wait_for(tmp_path / "child.pid"))
    assert _alive(child)
    ahead.close()
    for _ in range(100):
        if not _alive(child):
            break
        time.sleep(0.05)
    assert not _alive(child)
    assert not list((tmp_path / "tmp").iterdir())  # its log folder


def test_a_finished_build_is_named_in_its_stage_row_and_a_failed_one_is_not(tmp_path: Path) -> None:
    for status, note in (("0", "fake item built ahead"), ("1", ""), ("2", "")):  # built, found, failed
        (tmp_path / "status").write_text(status)
        ahead = Prebuilds(Store(tmp_path))
        ahead.start(STAGES, "cpu")
        assert [run.stage for run in ahead._running] == ["second"]  # third is not built for cpu
        assert ahead.note("second") == note  # it waits for the build's end
        assert ahead.note("first") == ""
        ahead.close()


def test_nothing_starts_for_an_item_already_cached(tmp_path: Path) -> None:
    (tmp_path / "cached").touch()
    ahead = Prebuilds(Store(tmp_path))
    ahead.start(STAGES, "cpu")
    assert not ahead._running
