"""An autotune stage's cache misses tuned as Slurm jobs (`--executor slurm`), for either target.

The stage deals its misses into a few shares; each share is one job running the target's
`tune_share` on a node, which tunes its kernels exactly as a local run does and leaves each
finished kernel as a subfolder `<key>/` of a folder under the cache's tmp/ (shared storage),
plus a marker per job saying where it ran, when, and whether it refused (a node whose toolchain
or GPU is not the one the build's keys name tunes nothing). The stage then files the kernels into
the same per-kernel cache items a local run writes; a kernel no job finished is tuned here, and
the stage's note says how many.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tasks.autotune.executors import Slurm, run_shares, shares_of


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

    def has(self, key: str) -> bool:
        return (self.folder / key).is_dir()

    def note(self, rerun_here: int) -> str:
        """ "tuned in 2 slurm jobs (slurm job 4 on n1, ...); engine overhead 40 ms a kernel" """
        overhead = max(0.0, self.seconds - self.tuning_seconds) / max(1, self.kernels)
        text = (f"{self.kernels} kernels tuned in {self.jobs} slurm jobs ({', '.join(self.places)}); "
                f"engine overhead {overhead * 1e3:.0f} ms a kernel")
        if rerun_here:
            text += f"; {rerun_here} rerun here, as their job did not finish ({self.error or 'no result'})"
        return text


@dataclass(frozen=True)
class Share:
    """A job's view of its share, on the node."""

    args: dict[str, Any]  # what the stage put in the share, "keys" and "out" among them
    out: Path
    job_id: str
    where: str  # "slurm job 7 on n1": each kernel's record and the report say it
    started: float  # wall clock: the stage compares it with its own (one host, or NTP's)

    @classmethod
    def begin(cls, share: str) -> Share:
        args = json.loads(share)
        job_id = os.environ.get("SLURM_JOB_ID", "?")
        return cls(args, Path(args["out"]), job_id, f"slurm job {job_id} on {socket.gethostname()}",
                   time.time())

    @contextmanager
    def kernel(self, key: str) -> Iterator[Path]:
        """A folder to fill with one kernel's files, published as `<key>/` whole or not at all."""
        staging = self.out / f".{key}.{os.getpid()}"
        staging.mkdir()
        yield staging
        staging.rename(self.out / key)

    def end(self, refused: str = "", failed: tuple[str, ...] = ()) -> str:
        """The share's marker, whole or not at all (the stage may read it as the job ends):
        `refused` says why the node tuned nothing, `failed` names kernels it could not tune."""
        mark: dict[str, Any] = {"where": self.where, "start": self.started, "end": time.time()}
        if refused:
            mark["said"] = f"{self.where} {refused}"
        elif failed:
            mark["said"] = f"{self.where} could not tune {', '.join(failed)}"
        staging = self.out / f".share-{self.job_id}.{os.getpid()}"
        staging.write_text(json.dumps(mark))
        staging.rename(self.out / f"share-{self.job_id}.json")
        return self.where


def tune_remotely(fn: Callable[[str], str], keys: list[str], payload: Mapping[str, Any],
                  settings: Mapping[str, str], store_root: Path) -> Remote:
    """Submits `keys` as a few jobs running fn (each share is `payload` plus its keys and the
    output folder, as JSON) and waits for them. The caller files what they made and removes the
    folder."""
    # Note: named as the store's staging folders are (stage-what-pid-uuid), so gc's clean_tmp
    # removes it should this process die before it does.
    out = store_root / "tmp" / f"autotune-remote-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    out.mkdir(parents=True)
    shares = [json.dumps({**payload, "keys": share, "out": str(out)})
              for share in shares_of(keys, Slurm.from_settings(settings).jobs)]
    started = time.time()
    try:
        error = run_shares(fn, shares, settings, out)
    except BaseException:  # no Slurm, no pydra, Ctrl-C: nothing of the folder is of use
        shutil.rmtree(out, ignore_errors=True)
        raise
    ended = time.time()
    done = [json.loads(p.read_text()) for p in sorted(out.glob("share-*.json"))]
    spans = [(max(d["start"], started), min(d["end"], ended)) for d in done]
    said = [d["said"] for d in done if "said" in d]
    filed = sum(1 for key in keys if (out / key).is_dir())
    return Remote(out, len(shares), filed, ended - started, union_seconds(spans),
                  tuple(d["where"] for d in done), "; ".join([*said, error] if error else said))


def union_seconds(spans: list[tuple[float, float]]) -> float:
    """The seconds covered by at least one of the spans."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(spans):
        start = max(start, reach)
        if end > start:
            total += end - start
            reach = end
    return total
