"""Kernel tuning through each executor, side by side: a model with many distinct kernels
(configs/wide.toml: 200) compiled cold for the cpu target with `--executor local` and with
`--executor slurm` on the local Slurm (scripts/slurm_local.sh, started here if it is down),
then a no-op recompile through Slurm, which must submit nothing.

    python scripts/bench_executors.py [--model wide] [--jobs 2] [--out build/bench-executors]

Prints, per executor: the autotune stage's seconds, kernels per second, and (slurm) the engine's
overhead per kernel as the stage measured it: wall time from the first submission to the last
job's end, less the time some job was tuning (the union of the jobs' spans), over the kernels.
Writes executors.json in --out.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _slurm_env() -> dict[str, str]:
    subprocess.run(["bash", str(ROOT / "scripts" / "slurm_local.sh"), "up"], check=True)
    line = subprocess.run(["bash", str(ROOT / "scripts" / "slurm_local.sh"), "env"], check=True,
                          capture_output=True, text=True).stdout.strip()
    return dict(os.environ, SLURM_CONF=line.split("=", 1)[1])


def _compile(model: str, cache: Path, out: Path, env: dict[str, str], executor: str) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "kiln", "--cache-dir", str(cache), "compile", model, "--target", "cpu",
           "--quiet", "--out", str(out), "--executor", executor]
    subprocess.run(cmd, cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)
    report = json.loads((out / "report.json").read_text())
    row = next(r for r in report["stages"] if r["stage"] == "autotune")
    return {"executor": executor, "status": row["status"], "autotune_s": row["seconds"],
            "compile_s": report["seconds"], "note": row["note"]}


def _job_count(env: dict[str, str]) -> int:
    out = subprocess.run(["sacct", "-a", "-n", "-X", "-S", "2000-01-01", "-o", "JobID"], env=env,
                         capture_output=True, text=True, check=True).stdout
    return len(out.split())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--model", default="wide")
    p.add_argument("--jobs", default="2", help="Slurm jobs the misses are batched into")
    p.add_argument("--out", type=Path, default=ROOT / "build" / "bench-executors")
    args = p.parse_args(argv)
    shutil.rmtree(args.out, ignore_errors=True)
    env = _slurm_env() | {"KILN_SERVER": "0", "KILN_SLURM_JOBS": args.jobs}
    kernels = None
    rows = []
    for executor in ("local", "slurm"):
        place = args.out / executor
        row = _compile(args.model, place / "cache", place / "build", env, executor)
        kernels = int(row["note"].split(" of ")[1].split()[0])
        row["kernels_per_s"] = round(kernels / row["autotune_s"], 2)
        rows.append(row)
    before = _job_count(env)
    noop = _compile(args.model, args.out / "slurm" / "cache", args.out / "slurm" / "again", env, "slurm")
    noop["jobs_submitted"] = _job_count(env) - before
    rows.append(noop | {"executor": "slurm (no-op)"})
    (args.out / "executors.json").write_text(json.dumps({"kernels": kernels, "rows": rows}, indent=1))
    print(f"{args.model}: {kernels} distinct kernels, cpu target")
    print(f"{'executor':<16}{'autotune s':>12}{'kernels/s':>12}  note")
    for row in rows:
        print(f"{row['executor']:<16}{row['autotune_s']:>12.2f}{row.get('kernels_per_s', 0):>12.2f}  "
              f"{row['status']}; {row['note']}" + (f"; jobs submitted {row['jobs_submitted']}"
                                                    if "jobs_submitted" in row else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
