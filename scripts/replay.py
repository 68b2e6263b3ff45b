"""Replay: does a change of kiln's layout change what kiln generates? (issue 20's guard)

    python scripts/replay.py record build/replay/before.json   # before the move
    python scripts/replay.py check build/replay/before.json    # after it: exit 1 on any change

Every model in configs/, on both targets, is compiled up to gen-cpp in a fresh cache (a
subprocess running `python -m kiln compile`), and the digest of every artifact
the deterministic stages wrote is kept: trace's program, lower's ir.json and signature,
schedule.json and its pass dumps, the kernel sources, kernels.json and tune.py, and gen-cpp's
wrapper.cpp and model.json. Key digests are not compared (moved code changes them).

Tuning decisions are compared by replaying them: each kernel of kernels.json gets timings made
up from its key (one variant failing, so the error path runs too), and the target's tuner
decides; the decisions' digest is kept. Measured timings are noise, so autotune's own
tuning.json is compared only where nothing is measured (the cuda target on a machine without a
GPU, where every kernel keeps its default).

A model whose factory needs a package that is not installed (torchvision here) is listed as
skipped, in the record and in the check.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TARGETS = ("cpu", "cuda")
COMPARED = ("trace", "lower", "schedule", "gen-tuning-code", "gen-cpp")
NOT_ARTIFACTS = ("meta.json", ".verified.json")
# Where each target's tuner decides, given timings (moves with the tuner; data is compared).
DECIDERS = {"cpu": "tasks.targets.cpu.tune:decide", "cuda": "tasks.targets.cuda.tune:decide"}
# Variant labels of a kernels.json entry, per target (the cuda tuner tries configs per variant).
LABELS = {"cpu": "tasks.targets.cpu.tune:labels", "cuda": "tasks.targets.cuda.tune:labels"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", choices=("record", "check"))
    p.add_argument("file", type=Path, help="the record (JSON)")
    p.add_argument("--models", nargs="*", help="config names (default: every config)")
    p.add_argument("--targets", nargs="*", default=list(TARGETS))
    args = p.parse_args(argv)
    models = args.models or sorted(c.stem for c in (ROOT / "configs").glob("*.toml"))
    now = {f"{m}/{t}": replay(m, t) for m in models for t in args.targets}
    if args.mode == "record":
        args.file.parent.mkdir(parents=True, exist_ok=True)
        args.file.write_text(json.dumps(now, indent=1, sort_keys=True) + "\n")
        print(f"recorded {len(now)} builds into {args.file}")
        return 0
    return _check(json.loads(args.file.read_text()), now)


def replay(model: str, target: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="kiln-replay-") as tmp:
        out = Path(tmp) / "build"
        command = [sys.executable, "-m", "kiln", "--cache-dir", str(Path(tmp) / "cache"),
                   "compile", model, "--target", target, "--until", "gen-cpp", "--out", str(out), "--quiet"]
        done = subprocess.run(command, check=False, cwd=ROOT, capture_output=True, text=True)
        if done.returncode != 0:
            if "needs the Python package" in done.stderr + done.stdout:
                return {"skipped": (done.stderr + done.stdout).strip().splitlines()[0]}
            raise SystemExit(f"{model} ({target}) failed to compile:\n{done.stdout}{done.stderr}")
        print(f"replayed {model} ({target})", flush=True)
        return _digests(Path(tmp) / "cache" / "store" / "objects", out, target)


def _digests(objects: Path, out: Path, target: str) -> dict[str, Any]:
    keys = {row["stage"]: row["key"] for row in json.loads((out / "report.json").read_text())["stages"]}
    files: dict[str, str] = {}
    for stage in (*COMPARED, "autotune"):
        folder = objects / stage / keys[stage]
        for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.name not in NOT_ARTIFACTS):
            name = path.relative_to(folder).as_posix()
            if stage == "autotune" and not (target == "cuda" and name == "tuning.json"):
                continue
            files[f"{stage}/{name}"] = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    kernels = json.loads((objects / "gen-tuning-code" / keys["gen-tuning-code"] / "kernels.json").read_text())
    return {"files": files, "decisions": _decisions(kernels["kernels"], target)}


def _decisions(entries: list[dict[str, Any]], target: str) -> str:
    decide, labels = _function(DECIDERS[target]), _function(LABELS[target])
    chosen = []
    for entry in entries:
        names = labels(entry)
        timings: dict[str, float | None] = {n: _made_up_seconds(entry["key"], n) for n in names}
        errors = {}
        if len(names) > 1:  # the last variant fails: the decision must skip it
            timings[names[-1]], errors[names[-1]] = None, "made up"
        chosen.append(decide(entry, timings, errors))
    return hashlib.sha256(json.dumps(chosen, sort_keys=True).encode()).hexdigest()[:16]


def _made_up_seconds(key: str, label: str) -> float:
    return 1e-6 * (1 + int(hashlib.sha256(f"{key}/{label}".encode()).hexdigest()[:6], 16) % 997)


def _function(ref: str) -> Callable[..., Any]:
    module, name = ref.split(":")
    sys.path.insert(0, str(ROOT))
    fn: Callable[..., Any] = getattr(importlib.import_module(module), name)
    return fn


def _check(before: dict[str, Any], now: dict[str, Any]) -> int:
    changed = 0
    for build in sorted(now):  # the builds replayed (--models, --targets): each must be in the record
        if build not in before:
            raise SystemExit(f"{build} is not in the record: record it first")
        old, new = before[build], now[build]
        if "skipped" in old or "skipped" in new:
            print(f"{build}: skipped ({old.get('skipped') or new.get('skipped')})")
            continue
        lines = _differences(old, new)
        changed += bool(lines)
        print(f"{build}: {'CHANGED' if lines else 'identical'} ({len(new.get('files', {}))} files)")
        for line in lines:
            print(f"  {line}")
    print(f"{changed} of {len(now)} builds changed")
    return 1 if changed else 0


def _differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    a, b = old.get("files", {}), new.get("files", {})
    lines = [f"{name}: {'new' if name not in a else 'gone' if name not in b else 'differs'}"
             for name in sorted(set(a) | set(b)) if a.get(name) != b.get(name)]
    if old.get("decisions") != new.get("decisions"):
        lines.append("tuning decisions differ")
    return lines


if __name__ == "__main__":
    raise SystemExit(main())
