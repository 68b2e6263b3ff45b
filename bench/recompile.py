"""Recompile benchmark (not a timed test): `python bench/recompile.py [MODEL]`.

Measures, on a fresh cache, in one run: a cold compile; a no-op recompile (wall time of the
whole `kiln compile` process, median of 5); a comment edit in the model's source file; and a
checkpoint swap. For the edits it checks which stages reran and whether the exported program
stayed byte-identical (so everything below trace is cut off).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pipeline.config import load_config  # noqa: E402

_CKPT_SCRIPT = """
import sys, torch
from safetensors.torch import save_file
sys.path.insert(0, {root!r})
from tasks.trace.factory import build_model
from pipeline.config import load_config
cfg = load_config({model!r})
fields = {{k: cfg.job_value(k) for k in cfg.fields}}
fields["weights.seed"] = {seed}
module = build_model(fields, cfg.name, cfg.project_root)
save_file({{k: v.contiguous().clone() for k, v in module.state_dict().items()}}, {path!r})
"""


def kiln(args: list[str], cache: Path) -> tuple[float, dict[str, Any]]:
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, KILN_CACHE_DIR=str(cache), PYTHONPATH=path)
    out = cache.parent / "out"
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "pipeline", *args, "--quiet", "--target", "cpu",
                    "--out", str(out)], check=True, env=env, cwd=ROOT, capture_output=True)
    seconds = time.perf_counter() - t0
    return seconds, json.loads((out / "report.json").read_text())


def statuses(report: dict[str, Any]) -> dict[str, str]:
    return {row["stage"]: row["status"] for row in report["stages"]}


def program_digest(cache: Path, report: dict[str, Any]) -> str:
    key = report["stages"][0]["key"]
    meta = json.loads((cache / "store" / "objects" / "trace" / key / "meta.json").read_text())
    return str(meta["artifacts"]["program.json"]["sha256"])


def checkpoint(model: str, seed: int, path: Path) -> None:
    code = _CKPT_SCRIPT.format(root=str(ROOT), model=model, seed=seed, path=str(path))
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)


def main(model: str) -> dict[str, Any]:
    config = load_config(model)
    results: dict[str, Any] = {"model": model}
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp) / "cache"
        results["cold_s"], report = kiln(["compile", model], cache)
        base = program_digest(cache, report)
        noop = [kiln(["compile", model], cache) for _ in range(5)]
        results["noop_s"] = statistics.median(s for s, _ in noop)
        results["noop_stages"] = statuses(noop[-1][1])
        results["comment_edit"] = comment_edit(model, config.field("model.factory"), cache, base)
        results["checkpoint_swap"] = checkpoint_swap(model, Path(tmp), cache)
    return results


def comment_edit(model: str, factory: str, cache: Path, base: str) -> dict[str, Any]:
    source = ROOT / (factory.split(":", maxsplit=1)[0].replace(".", "/") + ".py")
    original = source.read_text()
    try:
        source.write_text(original + "\n# a comment added by bench/recompile.py\n# and another\n")
        seconds, report = kiln(["compile", model], cache)
    finally:
        source.write_text(original)
    same = program_digest(cache, report) == base
    return {"file": source.relative_to(ROOT).as_posix(), "seconds": seconds,
            "stages": statuses(report), "program_identical": same}


def checkpoint_swap(model: str, tmp: Path, cache: Path) -> dict[str, Any]:
    ckpt = tmp / "ckpt.safetensors"
    checkpoint(model, 1, ckpt)
    text = load_config(model).path.read_text()
    cfg = tmp / "configs" / f"{model}-ckpt.toml"
    cfg.parent.mkdir()
    cfg.write_text(text.replace("[weights]", f'[weights]\ncheckpoint = "{ckpt}"'))
    _, first = kiln(["compile", str(cfg)], cache)
    checkpoint(model, 2, ckpt)
    seconds, report = kiln(["compile", str(cfg)], cache)
    same = program_digest(cache, report) == program_digest(cache, first)
    return {"seconds": seconds, "stages": statuses(report), "program_identical": same}


if __name__ == "__main__":
    name = sys.argv[1] if len(sys.argv) > 1 else "bert"
    found = main(name)
    print(json.dumps(found, indent=2))
    out = ROOT / "build" / f"bench-recompile-{name}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(found, indent=2) + "\n")
