"""In-memory recompile benchmark (not a timed test): `python bench/live_recompile.py [MODEL]`.

An in-memory module is traced on every compile (its key is the program it exports), so its
second compile costs a trace and nothing below it. This measures that, as a user would see it:
the model (a config's factory, seeded weights) is built in a fresh process and handed to
`kiln.compile`, twice, each time in a process of its own, on one fresh cache. Printed per
compile: the wall time of the compile() call, trace's seconds and every stage's status, and the
max error of the loaded build against eager.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

_CHILD = """
import json, sys, time
from pathlib import Path
import torch
from kiln import compile, load_config
from kiln.run_model import random_inputs, seeded_model
config = load_config(sys.argv[1])
device = "cuda" if sys.argv[2] == "cuda" else "cpu"
module = seeded_model(config).eval().to(device)
args = tuple(a.to(device) for a in random_inputs(config, config.field("weights.seed")))
start = time.perf_counter()
compiled = compile(module, args, target=sys.argv[2], out=Path(sys.argv[3]), cache_dir=Path(sys.argv[4]))
seconds = time.perf_counter() - start
leaves = torch.utils._pytree.tree_leaves
with torch.no_grad():
    pairs = zip(leaves(compiled(*args)), leaves(module(*args)))
    error = max(float((a.double() - b.double()).abs().max()) for a, b in pairs)
report = json.loads((Path(sys.argv[3]) / "report.json").read_text())
print(json.dumps({"seconds": seconds, "error": error, "stages": report["stages"]}))
"""


def compile_in_fresh_process(model: str, target: str, out: Path, cache: Path) -> dict[str, Any]:
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, "-c", _CHILD, model, target, str(out), str(cache)], cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=path), capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"the compile process failed:\n{proc.stderr[-3000:]}")
    found: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default="bert-small")
    parser.add_argument("--target", default="cpu")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp) / "cache"
        for label in ("first compile (cold cache)", "second compile (fresh process)"):
            found = compile_in_fresh_process(args.model, args.target, Path(tmp) / label.split()[0], cache)
            rows = {row["stage"]: row for row in found["stages"]}
            stages = ", ".join(f"{name} {row['status']}" for name, row in rows.items())
            print(f"{args.model} ({args.target}), {label}: compile() {found['seconds']:.2f} s, "
                  f"trace {rows['trace']['seconds']:.2f} s, max error {found['error']:.1e}\n    {stages}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
