"""What checking a build on load costs (not a timed test): `python bench/verify_load.py [MODEL]`.

Compiles MODEL (bert by default: 440 MB of fp32 weights) into a fresh folder, then, side by side
in one process with the file in the page cache, times `load(out)` (sizes, model.so's xxh3-128 and
the weights' xxh3-128, checked by model.so) against `load(out, verify=False)` (sizes only),
alternating, and the two hashes it could have used, over the weights file alone. Prints a table
and writes out/verify_load.json.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _median_seconds(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            h.update(chunk)
    return h.hexdigest()


def _xxh3(path: Path) -> str:
    import xxhash

    h = xxhash.xxh3_128()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            h.update(chunk)
    return str(h.hexdigest())


def _read(path: Path) -> int:
    total = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            total += len(chunk)
    return total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default="bert")
    parser.add_argument("--target", default="cpu")
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "bench" / "verify-load")
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    build = args.out / f"{args.model}-{args.target}"
    subprocess.run([sys.executable, "-m", "kiln", "compile", args.model, "--target", args.target,
                    "--out", str(build), "--quiet"], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    import torch  # noqa: F401  (before model.so)

    from kiln import load

    weights = build / "weights.safetensors"
    load(build)  # the pages in memory, model.so loaded once
    rows: dict[str, float] = {}
    for _ in range(args.repeat):  # alternating, so drift hits both alike
        rows["load, verified"] = rows.get("load, verified", 0.0) + _median_seconds(lambda: load(build), 1)
        rows["load, verify=False"] = rows.get("load, verify=False", 0.0) + _median_seconds(
            lambda: load(build, verify=False), 1)
    rows = {name: total / args.repeat for name, total in rows.items()}
    rows["read the weights file"] = _median_seconds(lambda: _read(weights), args.repeat)
    rows["xxh3-128 of the weights (python xxhash)"] = _median_seconds(lambda: _xxh3(weights), args.repeat)
    rows["sha256 of the weights (hashlib)"] = _median_seconds(lambda: _sha256(weights), args.repeat)
    size = weights.stat().st_size
    print(f"{args.model} ({args.target}): weights {size / 1e6:.0f} MB, "
          f"mean of {args.repeat} alternating loads")
    for name, seconds in rows.items():
        print(f"  {name:42} {seconds * 1e3:8.1f} ms  ({size / seconds / 1e9:5.1f} GB/s)")
    extra = rows["load, verified"] - rows["load, verify=False"]
    ratio = rows["load, verified"] / rows["load, verify=False"]
    print(f"  verification adds {extra * 1e3:.1f} ms ({ratio:.2f}x)")
    result = {"model": args.model, "target": args.target, "weights_bytes": size, "repeat": args.repeat,
              "seconds": rows}
    (args.out / "verify_load.json").write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
