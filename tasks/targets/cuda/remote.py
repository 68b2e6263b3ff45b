"""The cuda autotune stage's node side of `--executor slurm` (tasks/autotune/remote.py): a job
tunes its share's kernels on the node's GPUs exactly as a local run does (tune.py, one worker
per GPU Slurm gave it), and leaves each kernel's record and winning cubin for the stage to file.

A node whose GPU is not the one the build's keys name (the executor's `gpu` and `arch`
settings), or whose ptxas, triton or torch is not this host's, tunes nothing: its winners would
be filed under another GPU's or toolchain's key.

Note: no `from __future__ import annotations` here: pydra checks a task's inputs against its
function's annotations, and reads a postponed one ('str') as no type at all.
"""

import json
import shutil
import tempfile
from pathlib import Path

from contract.facts import env_fact, gpu_count
from contract.timings import LIBRARY
from tasks.autotune.remote import Share

RECORD = "record.json"
SUFFIXES = (".cubin", ".json")  # a kernel's cubin and its launch facts, as tune.py writes them
NODE_FACTS = ("gpu", "arch", "ptxas", "triton", "torch")  # key facts a node must share with the build


def tune_share(share: str) -> str:
    """Runs on a node: tunes the share's kernels; returns where it ran."""
    from tasks.targets.cuda import tune as cuda_tune

    job = Share.begin(share)
    wanted = job.args["facts"]
    found = {fact: env_fact(fact, "cuda") for fact in NODE_FACTS}
    if found != wanted:
        return job.end("has " + ", ".join(f"{fact} {found[fact]!r}, not {wanted[fact]!r}"
                                           for fact in NODE_FACTS if found[fact] != wanted[fact]))
    spec = Path(job.args["spec"])
    names = {e["key"]: e["kernel"] for e in json.loads(spec.read_text())["kernels"]}
    failed: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        made = Path(tmp)
        records = cuda_tune.tune_all(spec, job.args["keys"], made, gpu_count())
        for key in job.args["keys"]:
            record, stem = records.get(key), made / key[:16]
            library = record is not None and record.get("variant") == LIBRARY  # a matmul pair, apart
            if record is None or not (library or stem.with_suffix(".cubin").is_file()):
                failed.append(f"{names[key]} (no candidate runs)")  # nor will it here, most likely
                continue
            with job.kernel(key) as staging:
                for suffix in SUFFIXES:  # none where the library's calls won
                    if stem.with_suffix(suffix).is_file():
                        shutil.copyfile(stem.with_suffix(suffix), staging / f"kernel{suffix}")
                (staging / RECORD).write_text(json.dumps(record | {"where": job.where}, sort_keys=True))
    return job.end(failed=tuple(failed))
