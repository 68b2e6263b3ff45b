"""Recompile benchmark (not a timed test): `python bench/recompile.py [MODEL]`.

Measures, on a fresh cache, in one run: a cold compile; a no-op recompile (wall time of the
whole `kiln compile` process, median of 5); a comment edit in the model's source file; and a
checkpoint swap. For the edits it checks which stages reran and whether the exported program
stayed byte-identical (so everything below trace is cut off).
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.edits import write_config  # noqa: E402
from bench.kiln_runs import kiln_compile, program_digest  # noqa: E402
from bench.procs import child_env, run_worker  # noqa: E402
from kiln import load_config  # noqa: E402

TIMEOUT = 1800.0


def kiln(config: Path | str, tmp: Path) -> tuple[float, dict[str, Any]]:
    """One cpu compile on the cache in tmp; its seconds and report (an error stops the benchmark)."""
    found = kiln_compile(config, "cpu", tmp / "out", child_env(tmp), TIMEOUT)
    if "error" in found:
        raise RuntimeError(found["error"])
    return found["seconds"], found["report"]


def statuses(report: dict[str, Any]) -> dict[str, str]:
    return {row["stage"]: row["status"] for row in report["stages"]}


def checkpoint(model: str, seed: int, path: Path) -> None:
    """The model's weights made with another seed, saved to path (bench/workers.py)."""
    job = {"task": "checkpoint", "model": model, "seed": seed, "path": str(path),
           "result": str(path.with_suffix(".json"))}
    found = run_worker(job, child_env(path.parent / "checkpoint"), TIMEOUT)
    if "error" in found:
        raise RuntimeError(found["error"])


def main(model: str) -> dict[str, Any]:
    config = load_config(model)
    results: dict[str, Any] = {"model": model}
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        cache = tmp / "kiln"  # child_env's KILN_CACHE_DIR
        results["cold_s"], report = kiln(model, tmp)
        base = program_digest(cache, report)
        noop = [kiln(model, tmp) for _ in range(5)]
        results["noop_s"] = statistics.median(s for s, _ in noop)
        results["noop_stages"] = statuses(noop[-1][1])
        results["comment_edit"] = comment_edit(model, config.field("model.factory"), tmp, base)
        results["checkpoint_swap"] = checkpoint_swap(model, tmp)
    return results


def comment_edit(model: str, factory: str, tmp: Path, base: str) -> dict[str, Any]:
    source = ROOT / (factory.split(":", maxsplit=1)[0].replace(".", "/") + ".py")
    original = source.read_text()
    try:
        source.write_text(original + "\n# a comment added by bench/recompile.py\n# and another\n")
        seconds, report = kiln(model, tmp)
    finally:
        source.write_text(original)
    same = program_digest(tmp / "kiln", report) == base
    return {"file": source.relative_to(ROOT).as_posix(), "seconds": seconds,
            "stages": statuses(report), "program_identical": same}


def checkpoint_swap(model: str, tmp: Path) -> dict[str, Any]:
    ckpt = tmp / "ckpt.safetensors"
    checkpoint(model, 1, ckpt)
    cfg = write_config(load_config(model), tmp, f"{model}-ckpt", checkpoint=ckpt)
    _, first = kiln(cfg, tmp)
    checkpoint(model, 2, ckpt)
    seconds, report = kiln(cfg, tmp)
    same = program_digest(tmp / "kiln", report) == program_digest(tmp / "kiln", first)
    return {"seconds": seconds, "stages": statuses(report), "program_identical": same}


if __name__ == "__main__":
    name = sys.argv[1] if len(sys.argv) > 1 else "bert"
    found = main(name)
    print(json.dumps(found, indent=2))
    out = ROOT / "build" / f"bench-recompile-{name}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(found, indent=2) + "\n")
