"""Lower + schedule benchmark (not a timed test): `python bench/lower_schedule.py [MODEL]`.

On a fresh cache: traces the model once, then reruns lower and schedule (--force) pinned to
one CPU core, five times, and reports each stage's median seconds (its worker process
included: the start, the torch import, reading the program). A last compile on the unchanged
input must find both stages in the cache.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RUNS = 5


def kiln(args: list[str], cache: Path, one_core: bool) -> dict[str, Any]:
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, KILN_CACHE_DIR=str(cache), PYTHONPATH=path, OMP_NUM_THREADS="1")
    out = cache.parent / "out"
    pin = ["taskset", "-c", "0"] if one_core else []
    subprocess.run([*pin, sys.executable, "-m", "kiln", *args, "--quiet", "--target", "cpu",
                    "--out", str(out)], check=True, env=env, cwd=ROOT, capture_output=True)
    return dict(json.loads((out / "report.json").read_text()))


def rows(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {row["stage"]: row for row in report["stages"]}


def main(model: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp) / "cache"
        kiln(["compile", model, "--until", "trace"], cache, one_core=False)
        seconds: dict[str, list[float]] = {"lower": [], "schedule": []}
        for _ in range(RUNS):
            found = rows(kiln(["compile", model, "--until", "schedule", "--force", "lower",
                               "--force", "schedule"], cache, one_core=True))
            for stage, values in seconds.items():
                values.append(found[stage]["seconds"])
        again = rows(kiln(["compile", model, "--until", "schedule"], cache, one_core=True))
        lower_s, schedule_s = statistics.median(seconds["lower"]), statistics.median(seconds["schedule"])
        return {
            "model": model,
            "one_core": True,
            "lower_s": lower_s,
            "schedule_s": schedule_s,
            "lower_plus_schedule_s": round(lower_s + schedule_s, 3),
            "rerun_statuses": {s: again[s]["status"] for s in ("trace", "lower", "schedule")},
            "notes": {s: again[s]["note"] for s in ("lower", "schedule")},
        }


if __name__ == "__main__":
    report = main(sys.argv[1] if len(sys.argv) > 1 else "bert")
    print(json.dumps(report, indent=2))
    out = ROOT / "build" / f"bench-lower-schedule-{report['model']}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
