"""The store and the build folder under load (a soak, not a test): `python scripts/soak.py`.

4 processes compile 4 CPU models, 50 compiles each, on one cache, while gc trims the cache every
5 s (every sixth time below the latest builds) and random compiles are killed -9 at a random
moment. After every compile, killed or not, the build folder, if it holds a build, must load and
match eager (the model with its seeded weights, computed independently of any build). At the end
every entry of the store is re-hashed against its meta.json (a full verify, trusting no stamp),
and no lease, staging folder or lock of a dead process may remain after a last gc.

Prints a summary and exits non-zero on any failure; writes build/soak/soak.json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MODELS = ("mlp", "convnet", "cond", "while")

# A checker process per compiling process: reads "MODEL BUILD_DIR" lines, answers one JSON line.
_CHECKER = """
import json, sys
from pathlib import Path
import torch
from contract.config import load_config
from kiln.loader import load
from kiln.run_model import eager_model, flat_tensors, random_inputs
reference = {}
for line in sys.stdin:
    model, out = line.split()
    config = load_config(model)
    try:
        if model not in reference:
            inputs = random_inputs(config, 1)
            seeded = eager_model(config, Path("/nonexistent"))  # its own seeded weights, no build's
            reference[model] = (inputs, flat_tensors(seeded(*inputs)))
        inputs, want = reference[model]
        got = flat_tensors(load(out)(*inputs))
        error = max(float((a - b).abs().max()) for a, b in zip(got, want, strict=True))
        answer = {"ok": error < 1e-3, "error": error}
    except Exception as err:
        answer = {"ok": False, "error": f"{type(err).__name__}: {err}"}
    print(json.dumps(answer), flush=True)
"""


@dataclass
class Tally:
    compiles: int = 0
    succeeded: int = 0
    killed: int = 0
    failed: list[str] = field(default_factory=list)
    checks: int = 0
    bad_checks: list[str] = field(default_factory=list)
    gcs: int = 0
    removed: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, **counts: int) -> None:
        with self.lock:
            for name, n in counts.items():
                setattr(self, name, getattr(self, name) + n)


def _env() -> dict[str, str]:
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path}


def _kiln(cache: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "kiln", "--cache-dir", str(cache), *args]


def compiler(index: int, args: argparse.Namespace, tally: Tally) -> None:
    rng = random.Random(args.seed * 100 + index)
    checker = subprocess.Popen([sys.executable, "-c", _CHECKER], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True, env=_env(), cwd=ROOT)
    assert checker.stdin is not None
    assert checker.stdout is not None
    try:
        for _ in range(args.rounds):
            model = rng.choice(MODELS)
            out = args.work / f"p{index}" / model
            force = ["--force", rng.choice(["trace", "autotune", "link"])] if rng.random() < 0.3 else []
            proc = subprocess.Popen(_kiln(args.cache, "compile", model, "--target", "cpu", "--out", str(out),
                                          "--quiet", *force), cwd=ROOT, env=_env(),
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            kill_at = rng.uniform(0.2, 10.0) if rng.random() < args.kill_rate else None
            rc, stderr = _wait(proc, kill_at)
            tally.add(compiles=1)
            if rc == -signal.SIGKILL:
                tally.add(killed=1)
            elif rc == 0:
                tally.add(succeeded=1)
            else:
                tally.failed.append(f"{model} (p{index}) rc {rc}: {stderr[-1500:]}")
            if (out / "model.so").exists():
                checker.stdin.write(f"{model} {out}\n")
                checker.stdin.flush()
                answer = json.loads(checker.stdout.readline())
                tally.add(checks=1)
                if not answer["ok"]:
                    tally.bad_checks.append(f"{model} {out} after rc {rc}: {answer['error']}")
            elif rc == 0:
                tally.bad_checks.append(f"{model} {out}: compiled, but the folder has no model.so")
    finally:
        checker.stdin.close()
        checker.wait()


def _wait(proc: subprocess.Popen[bytes], kill_at: float | None) -> tuple[int, str]:
    try:
        _, err = proc.communicate(timeout=kill_at)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGKILL)
        _, err = proc.communicate()
    return proc.returncode, (err or b"").decode(errors="replace")


def collector(args: argparse.Namespace, tally: Tally, stop: threading.Event) -> None:
    count = 0
    while not stop.wait(args.gc_every):
        count += 1
        below = ["--include-latest"] if count % args.below_every == 0 else []
        run = subprocess.run(_kiln(args.cache, "cache", "gc", "--max-size", args.max_size, *below),
                             cwd=ROOT, env=_env(), capture_output=True, text=True, check=False)
        tally.add(gcs=1)
        if run.returncode != 0:
            tally.failed.append(f"gc rc {run.returncode}: {run.stderr[-1500:]}")
        elif run.stdout.startswith("removed "):
            tally.add(removed=int(run.stdout.split()[1]))


def full_verify(cache: Path) -> list[str]:
    """Every entry re-hashed against its meta.json; leftovers of dead processes after a last gc."""
    sys.path.insert(0, str(ROOT))
    from cache.hashing import digest_file
    from cache.leases import leases_dir

    problems = []
    subprocess.run(_kiln(cache, "cache", "gc", "--max-size", "1T"), cwd=ROOT, env=_env(), check=True,
                   capture_output=True)
    store = cache / "store"
    entries = 0
    for entry in sorted((store / "objects").glob("*/*")):
        entries += 1
        try:
            meta = json.loads((entry / "meta.json").read_text())
            for name, info in meta["artifacts"].items():
                path = entry / name
                if path.stat().st_size != info["bytes"] or digest_file(path) != info["xxh3_128"]:
                    problems.append(f"{entry.relative_to(store)}/{name} does not match its digest")
        except (OSError, ValueError, KeyError) as err:
            problems.append(f"{entry.relative_to(store)}: {err}")
    leftovers = [p.name for p in (store / "tmp").iterdir()] if (store / "tmp").is_dir() else []
    leftovers += [p.name for p in leases_dir(store).glob("*.lease")]
    leftovers += [p.name for p in (store / "locks").glob("*.lock")] if (store / "locks").is_dir() else []
    problems += [f"left over: {name}" for name in leftovers]
    print(f"full verify: {entries} entries re-hashed, {len(problems)} problems")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=50, help="compiles per process")
    parser.add_argument("--gc-every", type=float, default=5.0)
    parser.add_argument("--max-size", default="1M")
    parser.add_argument("--below-every", type=int, default=6,
                        help="every Nth gc trims below the latest builds")
    parser.add_argument("--kill-rate", type=float, default=0.2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", type=Path, default=ROOT / "build" / "soak")
    args = parser.parse_args()
    shutil.rmtree(args.work, ignore_errors=True)
    args.cache = args.work / "cache"
    tally, stop = Tally(), threading.Event()
    start = time.monotonic()
    gc_thread = threading.Thread(target=collector, args=(args, tally, stop))
    gc_thread.start()
    threads = [threading.Thread(target=compiler, args=(i, args, tally)) for i in range(args.processes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    gc_thread.join()
    problems = full_verify(args.cache)
    summary: dict[str, Any] = {
        "seconds": round(time.monotonic() - start, 1), "compiles": tally.compiles,
        "succeeded": tally.succeeded, "killed": tally.killed, "failed": tally.failed, "checks": tally.checks,
        "bad_checks": tally.bad_checks, "gc_runs": tally.gcs, "entries_removed_by_gc": tally.removed,
        "verify_problems": problems}
    (args.work / "soak.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    return 0 if not (tally.failed or tally.bad_checks or problems) else 1


if __name__ == "__main__":
    sys.exit(main())
