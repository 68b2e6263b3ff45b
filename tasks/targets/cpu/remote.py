"""The cpu autotune stage's node side of `--executor slurm` (tasks/autotune/remote.py): a job
builds and times its share's kernels exactly as a local run does (tune.py), and leaves each
kernel's record and winning object for the stage to file.

Note: no `from __future__ import annotations` here: pydra checks a task's inputs against its
function's annotations, and reads a postponed one ('str') as no type at all.
"""

import json
import shutil
import tempfile
from pathlib import Path

from contract.facts import env_fact
from tasks.autotune.remote import Share

RECORD, OBJECT = "record.json", "kernel.o"


def tune_share(share: str) -> str:
    """Runs on a node: tunes the share's kernels; returns where it ran."""
    from tasks.targets.cpu import tune as cpu_tune

    job = Share.begin(share)
    spec_path = Path(job.args["spec"])
    spec = json.loads(spec_path.read_text())
    folder = spec_path.parent / spec["folder"]
    keys = set(job.args["keys"])
    entries = [e for e in spec["kernels"] if e["key"] in keys]
    found = env_fact("cxx", "cpu")
    if found != job.args["cxx"]:  # its objects would be filed under another compiler's key
        return job.end(f"has compiler {found!r}, not {job.args['cxx']!r}")
    compiler = job.args["compiler"]
    failed: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        built = cpu_tune.build_variants(entries, folder, compiler, Path(tmp))
        for entry in entries:
            record = cpu_tune.tune_kernel(entry, folder, compiler, job.args["repeat"], built[entry["key"]])
            winner = built[entry["key"]][record["variant"]]
            if isinstance(winner, str):
                failed.append(f"{entry['names'][0]} ({winner})")  # the stage tunes it here, and says why
                continue
            with job.kernel(entry["key"]) as staging:
                shutil.copyfile(Path(winner).with_suffix(".o"), staging / OBJECT)
                (staging / RECORD).write_text(json.dumps(record | {"where": job.where}, sort_keys=True))
    return job.end(failed=tuple(failed))
