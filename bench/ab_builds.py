"""Two builds of one model, timed in turns in one process (not a timed test):
`python bench/ab_builds.py MODEL BEFORE_DIR AFTER_DIR [--rounds N] [--calls N] [--threads N]`.

For an A/B of a change to kiln: build the model at each commit (`kiln compile MODEL --out DIR`
in each checkout), then run this. Both builds get the same random inputs; their outputs are
compared bit for bit, and each round times --calls calls of one build, then of the other, so a
noisy machine slows both alike. Prints each median and their ratio (after / before).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def seconds_per_call(model: Any, inputs: tuple[Any, ...], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        model(*inputs)
    return (time.perf_counter() - start) / calls


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("model")
    p.add_argument("before", type=Path)
    p.add_argument("after", type=Path)
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--threads", type=int, default=1, help="torch's intra-op threads (default 1)")
    args = p.parse_args(argv)
    import torch

    from kiln import load_config
    from kiln.loader import load
    from kiln.run_model import flat_tensors, random_inputs

    torch.set_num_threads(args.threads)
    before, after = load(args.before), load(args.after)
    inputs = tuple(random_inputs(load_config(args.model), 1))
    same = all(torch.equal(a, b) for a, b in zip(flat_tensors(before(*inputs)), flat_tensors(after(*inputs)),
                                                  strict=True))
    times: dict[str, list[float]] = {"before": [], "after": []}
    for _ in range(args.rounds):
        times["before"].append(seconds_per_call(before, inputs, args.calls))
        times["after"].append(seconds_per_call(after, inputs, args.calls))
    first, second = (statistics.median(times[k]) for k in ("before", "after"))
    print(f"{args.model}: outputs {'bit-identical' if same else 'DIFFER'}; before {first * 1e3:.3f} ms, "
          f"after {second * 1e3:.3f} ms, ratio {second / first:.3f} (median of {args.rounds} rounds)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
