"""The runner on stand-in stages: keys, early cutoff, per-item keys, --force, --until, explain."""

from __future__ import annotations

from pathlib import Path

import pytest

from contract.config import ModelConfig, load_config
from contract.errors import KilnError
from pipeline.build import Cache, compile_model
from pipeline.explain import explain
from pipeline.runner import BuildOptions, BuildResult
from pipeline.stages import Stage
from pipeline.warm import WarmWorkers
from tests.conftest import write_config
from tests.fake_stages import FAKE_STAGES, STAGES_WITH_ASIDE


def _fake_config(project: Path, scale: int) -> ModelConfig:
    path = write_config(project, "fake")
    text = path.read_text().replace("{ width = 16 }", f"{{ scale = {scale} }}")
    path.write_text(text)
    return load_config(str(path))


def _build(project: Path, cache: Cache, scale: int = 2, **opts: object) -> BuildResult:
    config = _fake_config(project, scale)
    options = BuildOptions("cpu", project / "build", in_process=True, **opts)  # type: ignore[arg-type]
    return compile_model(config, options, cache, stages=FAKE_STAGES)


def _statuses(result: BuildResult) -> dict[str, str]:
    return {row.stage: row.status for row in result.rows}


def test_first_build_runs_everything_then_hits(project: Path, cache: Cache) -> None:
    first = _build(project, cache)
    assert _statuses(first) == {"first": "ran", "second": "ran", "third": "ran",
                                "fourth": "not built"}
    again = _build(project, cache)
    assert _statuses(again) == {"first": "hit", "second": "hit", "third": "hit",
                                "fourth": "not built"}
    assert [r.key for r in first.rows] == [r.key for r in again.rows]


def test_early_cutoff_when_output_is_unchanged(project: Path, cache: Cache) -> None:
    _build(project, cache, scale=2)
    result = _build(project, cache, scale=3)  # first reruns, writes the same bytes
    assert _statuses(result)["first"] == "ran"
    assert _statuses(result)["second"] == "cutoff"
    assert _statuses(result)["third"] == "cutoff"


def test_changed_output_reruns_dependents(project: Path, cache: Cache) -> None:
    _build(project, cache, scale=2)
    result = _build(project, cache, scale=-1)
    assert [_statuses(result)[s] for s in ("first", "second", "third")] == ["ran"] * 3


def test_force_reruns_one_stage_and_cuts_off_below(project: Path, cache: Cache) -> None:
    _build(project, cache)
    result = _build(project, cache, force=frozenset({"second"}))
    assert _statuses(result) == {"first": "hit", "second": "ran", "third": "cutoff",
                                 "fourth": "not built"}


def test_until_stops_after_the_stage(project: Path, cache: Cache) -> None:
    result = _build(project, cache, until="second")
    assert _statuses(result)["third"] == "skipped"
    assert "third" not in result.entries


def test_unknown_stage_in_force_is_a_clear_error(project: Path, cache: Cache) -> None:
    with pytest.raises(KilnError, match="unknown stage 'nope'"):
        _build(project, cache, force=frozenset({"nope"}))


def test_per_item_keys_recompute_only_changed_items(project: Path, cache: Cache) -> None:
    from cache.items import ItemCache

    items = ItemCache(cache.store, "demo")
    calls: list[str] = []

    def compute(name: str):  # type: ignore[no-untyped-def]
        def run(folder: Path) -> dict[str, str]:
            calls.append(name)
            (folder / "out.txt").write_text(name)
            return {}
        return run

    for name in ("k1", "k2", "k3"):
        items.get_or_compute({"kernel": name, "shape": "8x8"}, compute(name))
    assert calls == ["k1", "k2", "k3"]
    for name in ("k1", "k2"):
        _, hit = items.get_or_compute({"kernel": name, "shape": "8x8"}, compute(name))
        assert hit
    entry, hit = items.get_or_compute({"kernel": "k3", "shape": "16x8"}, compute("k3"))
    assert not hit
    assert calls == ["k1", "k2", "k3", "k3"]
    assert entry.file("out.txt").read_text() == "k3"


def test_published_artifacts_and_reports(project: Path, cache: Cache) -> None:
    import json

    result = _build(project, cache)
    out = result.out
    assert (out / "first.txt").read_text() == "positive\n"
    report = json.loads((out / "report.json").read_text())
    assert [row["stage"] for row in report["stages"]] == ["first", "second", "third", "fourth"]
    trace = json.loads((out / "trace.json").read_text())
    names = [e["name"] for e in trace["traceEvents"] if e["ph"] == "X"]
    assert names == ["first", "second", "third"]


def test_explain_names_the_changed_part(project: Path, cache: Cache) -> None:
    _build(project, cache, scale=2)
    config = _fake_config(project, 3)
    options = BuildOptions("cpu", project / "build", in_process=True)
    verdicts = explain(config, options, cache.store, cache.records, FAKE_STAGES)
    first, second, _third, fourth = verdicts
    assert first.rerun == "yes"
    assert first.reasons == ("part config.model.kwargs changed",)
    assert second.rerun == "maybe"
    assert "first" in second.reasons[0]
    assert fourth.rerun == "not built"
    unchanged = explain(_fake_config(project, 2), options, cache.store, cache.records, FAKE_STAGES)
    assert [v.rerun for v in unchanged] == ["no", "no", "no", "not built"]


def test_corrupted_entry_is_recomputed_with_a_warning(project: Path, cache: Cache) -> None:
    first = _build(project, cache)
    path = first.entries["second"].file("second.txt")
    path.chmod(0o644)
    path.write_text("garbage")
    result = _build(project, cache)
    assert _statuses(result)["second"] == "ran"
    assert _statuses(result)["third"] == "cutoff"
    assert any("corrupt" in w for w in result.warnings)
    assert result.entries["second"].file("second.txt").read_text() == "POSITIVE\n"


def test_corrupted_meta_is_recomputed(project: Path, cache: Cache) -> None:
    first = _build(project, cache)
    meta = first.entries["first"].path / "meta.json"
    meta.write_text("{ not json")
    result = _build(project, cache)
    assert _statuses(result)["first"] == "ran"
    assert any("corrupt" in w for w in result.warnings)


@pytest.fixture
def warm_pools(monkeypatch: pytest.MonkeyPatch) -> list[WarmWorkers]:
    """Every WarmWorkers a build makes, to look at after it."""
    made: list[WarmWorkers] = []

    class Recording(WarmWorkers):
        def __init__(self, target: str, tmp: Path, scope: str = "") -> None:
            super().__init__(target, tmp, scope)
            made.append(self)

    monkeypatch.setattr("pipeline.workers.WarmWorkers", Recording)
    return made


def _in_workers(project: Path, cache: Cache, scale: int) -> BuildResult:
    options = BuildOptions("cpu", project / "build")
    return compile_model(_fake_config(project, scale), options, cache, stages=FAKE_STAGES)


def test_each_stage_after_the_first_runs_in_a_worker_started_ahead(
        project: Path, cache: Cache, warm_pools: list[WarmWorkers]) -> None:
    first = _in_workers(project, cache, scale=2)
    assert _statuses(first) == {"first": "ran", "second": "ran", "third": "ran", "fourth": "not built"}
    assert warm_pools[0].taken == ["second", "third"]
    assert (project / "build" / "first.txt").read_text() == "positive\n"
    cut = _in_workers(project, cache, scale=3)  # second is cut off: its early worker exits unused
    assert _statuses(cut)["second"] == "cutoff"
    assert warm_pools[1].taken == []
    assert not warm_pools[1]._logs.exists()


def test_a_crash_in_a_worker_started_ahead_is_reported(
        project: Path, cache: Cache, warm_pools: list[WarmWorkers], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KILN_TEST_CRASH", "second")
    with pytest.raises(KilnError, match="stage second crashed"):
        _in_workers(project, cache, scale=2)
    assert warm_pools[0].taken == ["second"]
    monkeypatch.delenv("KILN_TEST_CRASH")
    again = _in_workers(project, cache, scale=2)  # nothing of the crash is left in the cache
    assert _statuses(again) == {"first": "hit", "second": "ran", "third": "ran", "fourth": "not built"}


def test_an_entry_that_fails_to_import_in_an_early_worker_reports_its_own_error(
        project: Path, cache: Cache, warm_pools: list[WarmWorkers]) -> None:
    broken = Stage("second", "", reads=("first/first.txt",),
                   entry="tests.no_such_module:second")
    options = BuildOptions("cpu", project / "build")
    with pytest.raises(KilnError, match="internal error in stage second: ModuleNotFoundError"):
        compile_model(_fake_config(project, 2), options, cache, stages=(FAKE_STAGES[0], broken))
    assert warm_pools[0].taken == ["second"]


def _with_aside(project: Path, cache: Cache, scale: int = 2) -> BuildResult:
    options = BuildOptions("cpu", project / "build")
    return compile_model(_fake_config(project, scale), options, cache, stages=STAGES_WITH_ASIDE)


def test_a_stage_no_later_stage_reads_runs_beside_the_ones_after_it(project: Path, cache: Cache) -> None:
    result = _with_aside(project, cache)
    rows = {row.stage: row for row in result.rows}
    assert [row.stage for row in result.rows] == ["first", "aside", "second", "third"]
    assert _statuses(result) == {"first": "ran", "aside": "ran", "second": "ran", "third": "ran"}
    assert rows["second"].start < rows["aside"].start + rows["aside"].seconds  # while aside ran
    assert rows["aside"].seconds >= 1.5  # its row is its own run, not the chain's
    assert (project / "build" / "aside.txt").read_text() == "positive aside\n"  # published
    again = _with_aside(project, cache)
    assert set(_statuses(again).values()) == {"hit"}


def test_a_stage_beside_the_chain_that_fails_fails_the_build_after_the_chain(
        project: Path, cache: Cache, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KILN_TEST_FAIL", "aside")
    with pytest.raises(KilnError, match="aside failed on purpose"):
        _with_aside(project, cache)
    monkeypatch.delenv("KILN_TEST_FAIL")
    again = _with_aside(project, cache)  # the chain's entries were kept; aside left nothing
    assert _statuses(again) == {"first": "hit", "aside": "ran", "second": "hit", "third": "hit"}


def test_a_chain_that_fails_stops_the_stage_beside_it(
        project: Path, cache: Cache, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import time

    log = tmp_path / "runs.log"
    monkeypatch.setenv("KILN_TEST_RUNLOG", str(log))
    monkeypatch.setenv("KILN_TEST_CRASH", "second")
    started = time.monotonic()
    with pytest.raises(KilnError, match="stage second crashed"):
        _with_aside(project, cache)
    assert "aside" in log.read_text().split()  # it had started
    assert time.monotonic() - started < 10
    assert not list((cache.store.tmp).glob("aside-*"))  # its staging folder is gone
    monkeypatch.delenv("KILN_TEST_CRASH")
    again = _with_aside(project, cache)
    assert _statuses(again)["aside"] == "ran"  # nothing of it was committed


def test_a_stage_that_measures_waits_for_the_stage_beside_the_chain(project: Path, cache: Cache) -> None:
    import dataclasses

    stages = (*STAGES_WITH_ASIDE[:3], dataclasses.replace(STAGES_WITH_ASIDE[3], measures=("cpu",)))
    options = BuildOptions("cpu", project / "build")
    result = compile_model(_fake_config(project, 2), options, cache, stages=stages)
    rows = {row.stage: row for row in result.rows}
    assert rows["aside"].beside
    assert rows["aside"].start + rows["aside"].seconds <= rows["third"].start  # third had the machine


def test_autotune_waits_for_the_weights_only_where_it_times_the_hosts_cores() -> None:
    from pipeline.stages import STAGES

    autotune = next(stage for stage in STAGES if stage.name == "autotune")
    assert autotune.measures_on("cpu")
    assert not autotune.measures_on("cuda")  # the GPU's own timings (cuda/tune.py: seconds)


def test_the_chrome_trace_puts_a_stage_beside_the_chain_on_a_track_of_its_own(project: Path,
                                                                               cache: Cache) -> None:
    from pipeline.report import chrome_trace, report_json

    events = chrome_trace(report_json(_with_aside(project, cache)))["traceEvents"][1:]
    assert {e["name"]: e["tid"] for e in events} == {"first": 1, "aside": 2, "second": 1, "third": 1}


def test_workers_are_started_ahead_for_every_stage_that_may_start_when_one_ends() -> None:
    from pipeline.stages import STAGES
    from pipeline.workers import starting_next

    chain = tuple(STAGES)
    names = {stage.name: tuple(s.name for s in starting_next(chain[i:])) for i, stage in enumerate(chain)}
    assert names["trace"] == ("weights", "lower")  # weights runs beside the chain: lower starts with it
    assert names["weights"] == ("lower",)
    assert names["lower"] == ("schedule",)
    assert names[chain[-1].name] == ()
    assert tuple(s.name for s in starting_next(FAKE_STAGES)) == ("second",)


def test_a_worker_ends_at_once_with_what_it_printed() -> None:
    import os
    import subprocess
    import sys

    code = "from pipeline.worker import exit_now; print('python line'); exit_now(3)"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # buffered, as a worker
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, env=env)
    assert done.returncode == 3
    assert done.stdout == "python line\n"
