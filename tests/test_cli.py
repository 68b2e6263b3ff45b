"""The command line end to end: errors, report, explain, cache commands, concurrent compiles
and a compile killed with SIGKILL mid-stage."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from io import StringIO
from pathlib import Path

import pytest
from rich.console import Console

from cli import main as cli
from contract.config import PROJECT_ROOT
from kiln.report import print_report
from pipeline.stages import STAGES
from tests.conftest import kiln, python_path


def _entries(cache_dir: Path) -> list[Path]:
    """Stage entries (per-item entries, like autotune's per kernel, apart)."""
    found = (cache_dir / "store" / "objects").glob("*/*")
    return sorted(p for p in found if not p.parent.name.endswith(".items"))


def _items(cache_dir: Path) -> list[Path]:
    return sorted((cache_dir / "store" / "objects").glob("*.items/*"))


BUILT = sum(stage.built_for("cpu") for stage in STAGES)  # one cache entry per stage built for cpu


def test_unknown_model(tmp_path: Path) -> None:
    proc = kiln(["compile", "no-such-model"], tmp_path / "c", check=False)
    assert proc.returncode == 1
    assert "unknown model 'no-such-model'" in proc.stderr
    assert "mlp" in proc.stderr  # the hint lists the known configs


def test_malformed_toml(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[model\nfactory = 1")
    proc = kiln(["compile", str(bad)], tmp_path / "c", check=False)
    assert proc.returncode == 1
    assert "not valid TOML" in proc.stderr
    assert "Traceback" not in proc.stderr


def _plain_console() -> tuple[Console, StringIO]:
    text = StringIO()
    return Console(file=text, highlight=False, width=200), text


@pytest.mark.parametrize(("body", "shown"), [
    ('[model]\nfactory = "m:f"\nbogus = 1\n', "bad.toml [model]: unknown key(s) bogus"),
    ('[model]\nfactory = "m:f"\n', "bad.toml: needs at least one [[inputs]] table"),
])
def test_config_error_keeps_table_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        body: str, shown: str) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(body)
    console, text = _plain_console()
    monkeypatch.setattr(cli, "_err", console)
    assert cli.main(["compile", str(bad)]) == 1
    assert f"kiln: error: {shown}" in text.getvalue()  # rich read neither as markup


def test_report_warning_keeps_brackets() -> None:
    console, text = _plain_console()
    report = {"model": "m", "target": "cpu", "seconds": 0.0, "stages": [],
              "warnings": ["[weights] checkpoint [bold]x[/bold] ignored"]}
    print_report(report, console)
    assert "warning: [weights] checkpoint [bold]x[/bold] ignored" in text.getvalue()


def test_report_and_explain_after_compile(project: Path, tmp_path: Path) -> None:
    config = str(project / "configs" / "toy.toml")
    out = tmp_path / "out"
    kiln(["compile", config, "--target", "cpu", "--out", str(out)], tmp_path / "c")
    report = kiln(["report", config, "--out", str(out)], tmp_path / "c")
    assert "trace" in report.stdout
    assert "ran" in report.stdout
    rows = {row["stage"]: row for row in json.loads((out / "report.json").read_text())["stages"]}
    assert rows["trace"]["status"] == "ran"
    # built ahead beside trace (tests/test_prebuild.py), unless a slow machine let link get there first
    assert rows["link"]["note"].endswith(("runtime cached; runtime built ahead", "runtime compiled"))
    assert (out / "weights.safetensors").is_file()
    explained = kiln(["explain", config, "--target", "cpu"], tmp_path / "c")
    assert "rerun: no" in explained.stdout
    model = project / "toymodel.py"
    model.write_text(model.read_text() + "\n# edited\n")
    explained = kiln(["explain", config, "--target", "cpu"], tmp_path / "c")
    assert "rerun: yes" in explained.stdout
    assert "part src:toymodel.py changed" in explained.stdout


def test_cache_info_gc_clear(project: Path, tmp_path: Path) -> None:
    cache_dir = tmp_path / "c"
    kiln(["compile", str(project / "configs" / "toy.toml"), "--target", "cpu"], cache_dir)
    info = kiln(["cache", "info"], cache_dir)
    assert "trace" in info.stdout
    gc = kiln(["cache", "gc", "--max-size", "0"], cache_dir)
    assert "removed 0 entries" in gc.stdout  # the latest build's entries are kept
    assert len(_entries(cache_dir)) == BUILT
    assert _items(cache_dir)  # and the per-kernel tuning records it used
    bad = kiln(["cache", "gc", "--max-size", "lots"], cache_dir, check=False)
    assert bad.returncode == 1
    kiln(["cache", "clear"], cache_dir)
    assert _entries(cache_dir) == []


def _spawn(args: list[str], cache_dir: Path, log: Path | None = None) -> subprocess.Popen[str]:
    env = dict(os.environ, KILN_CACHE_DIR=str(cache_dir), PYTHONPATH=python_path())
    if log is not None:
        env["KILN_TEST_RUNLOG"] = str(log)
    return subprocess.Popen([sys.executable, "-m", "kiln", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=PROJECT_ROOT)


def test_two_concurrent_compiles_do_the_work_once(project: Path, tmp_path: Path) -> None:
    cache_dir = tmp_path / "c"
    args = ["compile", str(project / "configs" / "toy.toml"), "--target", "cpu", "--quiet"]
    procs = [_spawn([*args, "--out", str(tmp_path / f"o{i}")], cache_dir) for i in range(2)]
    outputs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    rows = [json.loads((tmp_path / f"o{i}" / "report.json").read_text())["stages"][0]
            for i in range(2)]
    assert sorted(r["status"] for r in rows) == ["hit", "ran"]
    assert rows[0]["key"] == rows[1]["key"]
    assert len(_entries(cache_dir)) == BUILT


def test_kill_9_mid_stage_then_rerun(project: Path, tmp_path: Path) -> None:
    cache_dir = tmp_path / "c"
    config = project / "configs" / "toy.toml"
    # A factory that sleeps, so the kill lands inside the trace stage.
    model = project / "toymodel.py"
    model.write_text(model.read_text().replace(
        "def build(width: int = 16) -> Toy:\n",
        "def build(width: int = 16) -> Toy:\n    import os, time\n"
        "    if os.environ.get('TOY_SLEEP'):\n        time.sleep(60)\n"))
    os.environ["TOY_SLEEP"] = "1"
    try:
        proc = _spawn(["compile", str(config), "--target", "cpu", "--quiet"], cache_dir)
        staging = cache_dir / "store" / "tmp"
        deadline = time.time() + 60
        while time.time() < deadline and not (staging.is_dir() and any(staging.glob("trace-*"))):
            time.sleep(0.2)
        time.sleep(1.0)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        del os.environ["TOY_SLEEP"]
    assert _entries(cache_dir) == []
    rerun = kiln(["compile", str(config), "--target", "cpu", "--quiet"], cache_dir)
    assert "ran" in rerun.stdout
    assert len(_entries(cache_dir)) == BUILT
    kiln(["cache", "gc", "--max-size", "1G"], cache_dir)
    assert list(staging.iterdir()) == []  # the killed compile's staging folder is gone
