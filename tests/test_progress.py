"""Progress of a long stage reaches the live display from its worker process."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from contract.job import StageJob
from pipeline.workers import _wait


def test_a_job_in_process_reports_nothing_and_fails_nothing(tmp_path: Path) -> None:
    job = StageJob("autotune", "m", {}, {}, {}, str(tmp_path), "", "", "x:y")
    job.progress(1, 2, "kernels")  # no progress file: a no-op
    assert list(tmp_path.iterdir()) == []


def test_progress_is_written_whole(tmp_path: Path) -> None:
    path = tmp_path / "progress.json"
    job = StageJob("autotune", "m", {}, {}, {}, str(tmp_path), "", "", "x:y", progress_file=str(path))
    job.progress(3, 7, "kernels tuned")
    assert json.loads(path.read_text()) == [3, 7, "kernels tuned"]
    assert not path.with_suffix(".tmp").exists()


def test_the_runner_relays_a_workers_progress(tmp_path: Path) -> None:
    """A fake worker reports 1/2 then 2/2; the runner's callback hears them while it runs."""
    control = tmp_path / "ctl"
    control.mkdir()
    script = tmp_path / "fake_worker.py"
    script.write_text(
        "import json, sys, time, pathlib\n"
        "p = pathlib.Path(sys.argv[-1]) / 'progress.json'\n"
        "for n in (1, 2):\n"
        "    p.write_text(json.dumps([n, 2, 'kernels'])); time.sleep(0.6)\n")
    heard: list[tuple[int, int, str]] = []
    started = time.monotonic()
    _wait(subprocess.Popen([sys.executable, str(script), str(control)]), control,
          lambda done, total, what: heard.append((done, total, what)), None)
    assert time.monotonic() - started >= 1.0
    assert (1, 2, "kernels") in heard
    assert heard[-1] == (2, 2, "kernels")
