"""The cuda autotune stage's node side of `--executor slurm` (tasks/autotune/remote.py): a job
tunes its share's kernels on the node's GPUs exactly as a local run does (tune.py, one worker
per GPU Slurm gave it), and leaves each kernel's record and winning cubin for the stage to file.

A node whose GPU is not the one the build's keys name (the executor's `gpu` and `arch`
settings) tunes nothing: its winners would be filed under another GPU's key.

Note: no `from __future__ import annotations` here: pydra checks a task's inputs against its
function's annotations, and reads a postponed one ('str') as no type at all.
"""

import json
import shutil
import tempfile
from pathlib import Path

from contract.facts import gpu_arch, gpu_count, gpu_name
from tasks.autotune.remote import Share

RECORD = "record.json"
SUFFIXES = (".cubin", ".json")  # a kernel's cubin and its launch facts, as tune.py writes them


def tune_share(share: str) -> str:
    """Runs on a node: tunes the share's kernels; returns where it ran."""
    from tasks.targets.cuda import tune as cuda_tune

    job = Share.begin(share)
    found = (gpu_name(), gpu_arch())
    wanted = (job.args["gpu"], job.args["arch"])
    if found != wanted:
        return job.end(f"has GPU {found[0]!r} ({found[1]}), not {wanted[0]!r} ({wanted[1]})")
    with tempfile.TemporaryDirectory() as tmp:
        made = Path(tmp)
        records = cuda_tune.tune_all(Path(job.args["spec"]), job.args["keys"], made, gpu_count())
        for key, record in records.items():
            stem = made / key[:16]
            if not stem.with_suffix(".cubin").is_file():
                continue  # no candidate runs: the stage says so when it tunes it here
            with job.kernel(key) as staging:
                for suffix in SUFFIXES:
                    shutil.copyfile(stem.with_suffix(suffix), staging / f"kernel{suffix}")
                (staging / RECORD).write_text(json.dumps(record | {"where": job.where}, sort_keys=True))
    return job.end()
