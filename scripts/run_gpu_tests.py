"""`make test-gpu`: every test on the gpu marker, each in a process of its own, a few at a time.

Usage: python3 scripts/run_gpu_tests.py [--jobs N] [--logs DIR] [PYTEST_ARGS ...]

Note: one process per test, so a native crash (a segfault in a model's run, say) fails that test
and the others still run and report; and the device machine's minutes go further with several
tests at once (compiles and tuning of different models overlap on its cores). Each test's whole
output is kept in DIR/<n>.log; the failures' tails are printed at the end. Each test runs in a
process group of its own, and when this script is stopped (SIGTERM from `timeout`, Ctrl-C) it
kills those groups: a test left running would load the GPU and the cores under whatever the
caller runs next (a benchmark, say).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TAIL = 60  # lines of a failing test's log printed at the end
_running: set[subprocess.Popen[bytes]] = set()
_lock = threading.Lock()
_stopping = threading.Event()


def collect(extra: list[str]) -> list[str]:
    proc = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "--collect-only", "-q", *extra],
                          cwd=ROOT, capture_output=True, text=True, check=False)
    nodes = [line for line in proc.stdout.splitlines() if "::" in line]
    if not nodes:
        raise SystemExit(f"no gpu tests collected:\n{proc.stdout}\n{proc.stderr}")
    return nodes


def run_one(index: int, node: str, logs: Path) -> tuple[str, str, float, Path]:
    log = logs / f"{index:03d}.log"
    started = time.perf_counter()
    with log.open("w") as out:
        out.write(f"{node}\n")
        out.flush()
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--tb=short", "-m", "gpu",
               node]
        with _lock:
            if _stopping.is_set():
                return node, "not run", 0.0, log
            proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            _running.add(proc)
        proc.wait()
        with _lock:
            _running.discard(proc)
        with contextlib.suppress(ProcessLookupError):  # whatever the test left running
            os.killpg(proc.pid, signal.SIGKILL)
    seconds = time.perf_counter() - started
    status = {0: "passed", 1: "FAILED", 5: "skipped"}.get(proc.returncode, f"CRASHED ({proc.returncode})")
    if status == "passed" and " skipped" in log.read_text().splitlines()[-1]:
        status = "skipped"
    return node, status, seconds, log


def stop_all() -> None:
    """Kills every test still running, with whatever it started (its process group)."""
    for sig in (signal.SIGTERM, signal.SIGINT):  # a second signal must not cut this short
        signal.signal(sig, signal.SIG_IGN)
    with _lock:
        _stopping.set()
        for proc in _running:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=4)
    parser.add_argument("--logs", type=Path, default=ROOT / "build" / "gpu-tests")
    args, extra = parser.parse_known_args()
    args.logs.mkdir(parents=True, exist_ok=True)
    nodes = collect(extra)
    print(f"{len(nodes)} gpu tests, {args.jobs} at a time; logs in {args.logs}", flush=True)
    started = time.perf_counter()
    results = []
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(124))  # as `timeout` reports it
    pool = ThreadPoolExecutor(args.jobs)
    try:
        futures = [pool.submit(run_one, i, node, args.logs) for i, node in enumerate(nodes)]
        for future in futures:
            node, status, seconds, log = future.result()
            results.append((node, status, log))
            print(f"{status:>12} {seconds:7.1f} s  {node}", flush=True)
    finally:
        stop_all()
        pool.shutdown(wait=False, cancel_futures=True)
    failed = [(node, log) for node, status, log in results if status not in ("passed", "skipped")]
    for node, log in failed:
        print(f"\n==== {node} ({log.name}) ====")
        print("\n".join(log.read_text().splitlines()[-TAIL:]))
    counts = {s: sum(status == s for _, status, _ in results) for s in ("passed", "skipped")}
    print(f"\n{counts['passed']} passed, {counts['skipped']} skipped, {len(failed)} failed "
          f"in {time.perf_counter() - started:.1f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
