"""One case per process, a few processes at a time: what scripts/zoo.py and scripts/opinfo.py share.

A case's process prints its result as one marked JSON line (`report`); the parent runs each
case's command with a deadline (`run_case`), so a native crash or a hang costs that case only,
and prints each result as it comes (`run_all`). `run_forked` runs a case in a fork of the
parent instead, for cases that share a slow import (OpInfo's database takes seconds).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

MARK = "RESULT "


def report(found: dict[str, Any]) -> None:
    """In the case's process: its result, for run_case to read."""
    print(MARK + json.dumps(found), flush=True)


def run_case(cmd: list[str], cwd: Path, log: Path, timeout: float) -> dict[str, Any]:
    """The result the case's process reported, or {"status": "timeout"} or {"status": "crash",
    "exit": code} when it reported none; its stderr goes to log."""
    try:
        with log.open("w") as sink:
            done = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=sink, text=True,
                                  timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return {"status": "timeout"}
    lines = [line for line in done.stdout.splitlines() if line.startswith(MARK)]
    if not lines:
        return {"status": "crash", "exit": done.returncode}
    found: dict[str, Any] = json.loads(lines[-1][len(MARK):])
    return found


def run_forked(call: Callable[[], dict[str, Any]], log: Path, timeout: float) -> dict[str, Any]:
    """call() in a fork of this process, its stdout and stderr going to log: its result, or
    {"status": "timeout"} or {"status": "crash", "exit": code} when it returned none.

    Note: the parent must not have run torch's thread pools (OpenMP is not fork-safe once
    used); importing torch and building op_db's entries runs none of them."""
    context = multiprocessing.get_context("fork")
    reader, writer = context.Pipe(duplex=False)
    process = context.Process(target=_forked, args=(call, writer, log))
    process.start()
    writer.close()
    found: dict[str, Any] = {"status": "timeout"}
    if reader.poll(timeout):
        try:
            found = reader.recv()
        except EOFError:  # it died without a result: a native crash
            process.join()
            found = {"status": "crash", "exit": process.exitcode}
    process.kill()
    process.join()
    reader.close()
    return found


def _forked(call: Callable[[], dict[str, Any]], writer: Any, log: Path) -> None:
    with log.open("w") as sink:
        os.dup2(sink.fileno(), 1)
        os.dup2(sink.fileno(), 2)
    # Note: fresh stdio objects: the parent forks from worker threads while its main thread
    # prints, so the inherited ones may hold a lock no thread here will release, and a buffer
    # of the parent's output.
    sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
    writer.send(call())
    writer.close()


def run_all(cases: Sequence[str], run: Callable[[str], dict[str, Any]], jobs: int) -> list[dict[str, Any]]:
    """run(case) for every case, `jobs` at a time, each result printed as it comes; in case order."""
    results: dict[str, dict[str, Any]] = {}
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = {pool.submit(run, case): case for case in cases}
        for future in as_completed(futures):
            results[futures[future]] = future.result()
            print(json.dumps(results[futures[future]]), flush=True)
    return [results[case] for case in cases]
