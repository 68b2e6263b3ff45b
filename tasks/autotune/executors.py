"""Where a stage's per-kernel work runs: here (the default), or as a few jobs on a Slurm cluster
through pydra's SlurmWorker.

A stage hands `run_shares` a module-level function and its shares (lists of kernel keys, with
whatever else the function takes); each share becomes one job. What a job makes it writes into
a folder the stage named, on storage the cluster shares with this machine; the stage then files
it into the same per-kernel cache items a local run writes, so the two kinds of run share hits.

Note: pydra is the executor only. Its own cache is a fresh folder per call and never consulted:
kiln checks its cache before it submits anything (only misses are shares), and pydra's hashes
were found unreliable (DESIGN.md section 7). The guards from there apply: NO_ET=1 (no version
ping from the nodes), plain JSON-able inputs, one Submitter per call.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from contract.errors import KilnError
from contract.executor_settings import LOCAL, check_kind

_POLL_S = 0.5  # how often pydra asks squeue about a job


@dataclass(frozen=True)
class Slurm:
    """How jobs are submitted (StageJob.executor's fields; not key parts)."""

    partition: str = ""
    gres: str = ""
    time_min: int = 30  # each job's limit: a job past it is cancelled and its kernels rerun here
    account: str = ""
    jobs: int = 2  # how many jobs a stage's misses are batched into, at most
    queue_min: float = 10.0  # a job still pending this long after submission is cancelled
    # Note: a job times kernels, so by default it takes its node whole (--exclusive), as a local
    # run times one kernel at a time: two jobs timing side by side on one node would skew both.
    exclusive: bool = True

    @classmethod
    def from_settings(cls, settings: Mapping[str, str]) -> Slurm:
        return cls(settings.get("partition", ""), settings.get("gres", ""),
                   int(settings.get("time_min", "30")), settings.get("account", ""),
                   max(1, int(settings.get("jobs", "2"))), float(settings.get("queue_min", "10")),
                   settings.get("exclusive", "1") != "0")

    def sbatch_args(self, name: str) -> str:
        args = [f"-J {name}", f"-t {self.time_min}", "--no-requeue"]
        args += ["--exclusive"] if self.exclusive else []
        args += [f"-p {self.partition}"] if self.partition else []
        args += [f"--gres={self.gres}"] if self.gres else []
        args += [f"-A {self.account}"] if self.account else []
        return " ".join(args)


def kind_of(settings: Mapping[str, str]) -> str:
    return check_kind(settings.get("kind", LOCAL) or LOCAL, "executor")


def shares_of(keys: list[str], count: int) -> list[list[str]]:
    """The keys dealt into at most `count` shares, in order within each."""
    count = max(1, min(count, len(keys)))
    return [keys[i::count] for i in range(count)]


def run_shares(fn: Callable[[str], str], shares: list[str], settings: Mapping[str, str],
               scratch: Path) -> str:
    """Each share (a JSON text fn reads) as one Slurm job running fn(share); "" when every job
    ran to its end, else what went wrong.

    fn writes what it makes, and a marker per finished share, where the share says: the caller
    takes what is there and reruns the rest here. Every job has a deadline: time_min once it
    runs, queue_min while it waits with none of its siblings running. Ctrl-C or any error here
    cancels every job of this call still queued or running.

    Note: pydra's Submitter stops waiting at the first job that fails and leaves the others
    running, so after a failure the others are waited for here (their deadlines hold), and the
    outcome of each share is read from its marker, never from pydra's results.
    """
    os.environ["NO_ET"] = "1"  # before pydra is imported; the jobs inherit it: no etelemetry ping
    try:
        import pydra  # type: ignore[import-untyped]
    except ModuleNotFoundError as err:
        raise KilnError("the slurm executor needs pydra", "pip install 'pydra==0.25' 'cloudpickle<=3.1.2'") \
            from err
    _check_slurm()
    slurm = Slurm.from_settings(settings)
    name = f"kiln-{uuid.uuid4().hex[:12]}"
    task = pydra.mark.task(fn)
    scratch.mkdir(parents=True, exist_ok=True)
    stop = threading.Event()
    expired: set[str] = set()
    error = ""
    reaper = _reaper(name)
    try:
        threading.Thread(target=_expire_pending, args=(name, slurm.queue_min * 60, stop, expired),
                         daemon=True).start()
        with tempfile.TemporaryDirectory(dir=scratch, prefix="pydra-", ignore_cleanup_errors=True) as cache:
            work = task(name="kiln_share", cache_dir=cache).split("share", share=shares)
            try:
                with pydra.Submitter(plugin="slurm", sbatch_args=slurm.sbatch_args(name),
                                     poll_delay=_POLL_S) as submitter:
                    submitter(work)
            except Exception as err:  # a job failed, timed out or was cancelled: its markers tell
                first = (str(err).strip().splitlines() or [""])[0]
                error = f"{type(err).__name__}: {first[:300]}"
                _wait_for_the_rest(name)
    finally:
        stop.set()
        _cancel(name)
        reaper.kill()
        reaper.wait()
    if expired:
        late = f"{len(expired)} job(s) still pending after {slurm.queue_min:g} min were cancelled"
        error = f"{late}; {error}" if error else late
    return error


def _jobs_of(name: str) -> list[tuple[str, str]]:
    """(id, state) of this call's jobs still queued or running; [] if squeue cannot say."""
    try:
        out = subprocess.run(["squeue", "-h", "--name", name, "-o", "%i %t"], capture_output=True, text=True,
                             timeout=20, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [(line.split()[0], line.split()[1]) for line in out.splitlines() if len(line.split()) == 2]


def _wait_for_the_rest(name: str) -> None:
    """Waits until none of this call's jobs is queued or running (each has a deadline)."""
    while _jobs_of(name):
        time.sleep(_POLL_S)


def _expire_pending(name: str, after_s: float, stop: threading.Event, expired: set[str]) -> None:
    """Cancels this call's pending jobs once `after_s` seconds have passed with none of them
    running (a partition that is down, a queue that never moves): a running job has Slurm's time
    limit, a pending one none, and the build must never hang. A job pending behind a running
    sibling (on an exclusive node) is waiting for it, not for the queue."""
    idle_since = time.monotonic()
    while not stop.wait(1.0):
        jobs = _jobs_of(name)
        if any(state in ("R", "CG", "CF") for _, state in jobs):
            idle_since = time.monotonic()
        elif time.monotonic() - idle_since > after_s and jobs:
            try:
                subprocess.run(["scancel", "--state=PENDING", "--name", name], capture_output=True,
                               timeout=20, check=False)
            except (OSError, subprocess.SubprocessError):
                continue  # asked again shortly
            expired.update(job for job, state in jobs if state == "PD")


# Note: the runner takes a stage's worker down with SIGKILL on Ctrl-C, and a kill -9 of the
# runner does the same, so no `finally` here would cancel the jobs. A process of its own
# session (which a parent's death signal does not reach) waits for this one to end, then
# cancels whatever of this call's jobs is still queued or running.
def _reaper(name: str) -> subprocess.Popen[bytes]:
    watch = f"while kill -0 {os.getpid()} 2>/dev/null; do sleep 1; done; scancel --name {name}"
    return subprocess.Popen(["sh", "-c", watch], start_new_session=True, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


# Note: a busy slurmctld (one just started, or a loaded host) can fail a query now and then;
# sinfo is asked again before the build gives up on Slurm. No sinfo at all fails at once.
def _check_slurm(tries: int = 4) -> None:
    for attempt in range(tries):
        error = _sinfo()
        if error is None:
            return
        if isinstance(error, OSError) or attempt + 1 == tries:
            hint = "start one (bash scripts/slurm_local.sh up, then eval its `env`) or set SLURM_CONF"
            what = f"the slurm executor found no Slurm here ({type(error).__name__})"
            raise KilnError(what, hint) from error
        time.sleep(2.0)


def _sinfo() -> Exception | None:
    """What went wrong asking Slurm for its partitions, if anything."""
    try:
        subprocess.run(["sinfo", "-h"], capture_output=True, check=True, timeout=20)
    except (OSError, subprocess.SubprocessError) as err:
        return err
    return None


def _cancel(name: str) -> None:
    """Cancel every job of this call still queued or running (none, after a clean run)."""
    try:
        subprocess.run(["scancel", "--name", name], capture_output=True, timeout=20, check=False)
    except (OSError, subprocess.SubprocessError):
        return  # no scancel: nothing was submitted either
