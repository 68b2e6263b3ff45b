"""The cpu autotune stage's kernels tuned as Slurm jobs (`--executor slurm`).

The stage deals its cache misses into a few shares; each share is one job running `tune_share`
on a node, which builds and times its kernels exactly as a local run does (tune.py) and writes
each kernel's record and winning object into a folder under the cache's tmp/ (shared storage).
The stage then files them into the per-kernel cache items; a kernel a job did not finish is
tuned here, and the stage's note says how many.

Note: no `from __future__ import annotations` here: pydra checks a task's inputs against its
function's annotations, and reads a postponed one ('str') as no type at all.
"""

import json
import os
import shutil
import socket
import tempfile
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contract.facts import env_fact
from tasks.autotune.executors import Slurm, run_shares, shares_of

RECORD, OBJECT = "record.json", "kernel.o"


def tune_share(share: str) -> str:
    """Runs on a node: tunes the share's kernels; returns where it ran."""
    from tasks.targets.cpu import tune as cpu_tune

    args = json.loads(share)
    spec_path = Path(args["spec"])
    spec = json.loads(spec_path.read_text())
    folder = spec_path.parent / spec["folder"]
    keys = set(args["keys"])
    entries = [e for e in spec["kernels"] if e["key"] in keys]
    out = Path(args["out"])
    job_id = os.environ.get("SLURM_JOB_ID", "?")
    where = f"slurm job {job_id} on {socket.gethostname()}"
    started = time.time()  # wall clock: the stage compares it with its own (one host, or NTP's)
    found = env_fact("cxx", "cpu")
    if found != args["cxx"]:  # its objects would be filed under another compiler's key
        _mark(out, job_id, {"where": where, "start": started, "end": time.time(),
                            "refused": f"{where} has compiler {found!r}, not {args['cxx']!r}"})
        return where
    with tempfile.TemporaryDirectory() as tmp:
        built = cpu_tune.build_variants(entries, folder, args["compiler"], Path(tmp))
        for entry in entries:
            record = cpu_tune.tune_kernel(entry, folder, args["compiler"], args["repeat"],
                                          built[entry["key"]])
            winner = built[entry["key"]][record["variant"]]
            if isinstance(winner, str):
                continue  # no variant builds: the stage tunes it here and reports the error
            staging = out / f".{entry['key']}.{os.getpid()}"
            staging.mkdir()
            shutil.copyfile(Path(winner).with_suffix(".o"), staging / OBJECT)
            (staging / RECORD).write_text(json.dumps(record | {"where": where}, sort_keys=True))
            staging.rename(out / entry["key"])
    _mark(out, job_id, {"where": where, "start": started, "end": time.time()})
    return where


def _mark(out: Path, job_id: str, mark: dict[str, Any]) -> None:
    """The share's marker, whole or not at all (the stage may read it as the job ends)."""
    staging = out / f".share-{job_id}.{os.getpid()}"
    staging.write_text(json.dumps(mark))
    staging.rename(out / f"share-{job_id}.json")


@dataclass(frozen=True)
class Remote:
    """What the jobs left: a subfolder per kernel they finished, and what they said."""

    folder: Path
    jobs: int
    kernels: int
    seconds: float  # wall time from the first submission to the last job's end, here
    tuning_seconds: float  # how long some job was tuning, in that time (their union)
    places: tuple[str, ...]
    error: str

    def note(self, rerun_here: int) -> str:
        """ "tuned in 2 slurm jobs (slurm job 4 on n1, ...); engine overhead 40 ms a kernel" """
        overhead = max(0.0, self.seconds - self.tuning_seconds) / max(1, self.kernels)
        text = (f"{self.kernels} kernels tuned in {self.jobs} slurm jobs ({', '.join(self.places)}); "
                f"engine overhead {overhead * 1e3:.0f} ms a kernel")
        if rerun_here:
            text += f"; {rerun_here} rerun here, as their job did not finish ({self.error or 'no result'})"
        return text


def tune_remotely(missing: list[dict[str, Any]], kernels_json: Path, compiler: list[str], repeat: int,
                  settings: Mapping[str, str], store_root: Path, cxx: str) -> Remote:
    """Submits the missing kernels as a few jobs and waits for them. The caller files what they
    made and removes the folder. A node whose compiler is not `cxx` (this build's key fact)
    tunes nothing, and its kernels are tuned here."""
    # Note: named as the store's staging folders are (stage-what-pid-uuid), so gc's clean_tmp
    # removes it should this process die before it does.
    out = store_root / "tmp" / f"autotune-remote-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    out.mkdir(parents=True)
    keys = [e["key"] for e in missing]
    shares = [json.dumps({"spec": str(kernels_json), "compiler": compiler, "repeat": repeat, "cxx": cxx,
                          "keys": share, "out": str(out)})
              for share in shares_of(keys, Slurm.from_settings(settings).jobs)]
    started = time.time()
    error = run_shares(tune_share, shares, settings, out)
    ended = time.time()
    done = [json.loads(p.read_text()) for p in sorted(out.glob("share-*.json"))]
    spans = [(max(d["start"], started), min(d["end"], ended)) for d in done]
    refused = [d["refused"] for d in done if "refused" in d]
    filed = sum(1 for key in keys if (out / key).is_dir())
    return Remote(out, len(shares), filed, ended - started, _union(spans),
                  tuple(d["where"] for d in done), "; ".join([*refused, error] if error else refused))


def _union(spans: list[tuple[float, float]]) -> float:
    """The seconds covered by at least one of the spans."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(spans):
        start = max(start, reach)
        if end > start:
            total += end - start
            reach = end
    return total
