"""PyTorch's OpInfo database through `kiln.compile`: `make opinfo`.

Usage:
    python scripts/opinfo.py [--ops add,cumsum | --sample N --seed S] [--samples K] [--jobs N]
                             [--timeout S] [--out DIR]

Each op of `op_db` (the installed torch's, float32, on CPU) gets its first K sample inputs, the
samples its own tests use, compiled together as one model. An op is judged only where its
eager result can be judged: eager gives the same result twice (no randomness), every output
is a real tensor (or a tuple of them), and torch.export takes the call. A judged op passes
when its samples compile and match eager within float32 tolerances (NaNs where eager has
them); a passing op counts as compiled by kiln when its build calls no aten fallback. Each op
runs in a fork of its own (the database is imported once, before), so a native crash or a
hang costs that op only.

Prints one JSON line per op and a summary; writes DIR/opinfo.json. The failure's first line
is kept, so the classes of failure can be counted (`--classes`).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import sys
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if __package__ in (None, ""):  # run as a file (python scripts/opinfo.py): the project root first
    sys.path.insert(0, str(ROOT))
from scripts.isolated import run_all, run_forked  # noqa: E402

RTOL, ATOL = 1.3e-5, 1e-5  # float32, as torch.testing.assert_close
# Ops whose result is random by design: never judged (OpInfo marks few of them).
_RANDOM = re.compile(r"rand|dropout|normal|bernoulli|multinomial|uniform|poisson|exponential|geometric|"
                     r"cauchy|log_normal|empty|new_empty")


def op_names() -> list[str]:
    from torch.testing._internal.common_methods_invocations import op_db

    return sorted({_full_name(op) for op in op_db})


def _full_name(op: Any) -> str:
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


def _find(name: str) -> Any:
    from torch.testing._internal.common_methods_invocations import op_db

    found = next((op for op in op_db if _full_name(op) == name), None)
    if found is None:
        raise ValueError(f"{name!r} is no op of op_db (names as `make opinfo` lists them)")
    return found


class Unjudged(Exception):
    """The op cannot be judged: its eager result is random, complex, sparse, not tensors, or
    export fails."""


def _module_for(op: Any, samples: list[Any]) -> tuple[Any, tuple[Any, ...]]:
    """A module whose forward calls the op on each sample, returning one output per sample, with
    the samples' tensors as its inputs and everything else (dims, scalars, flags) fixed."""
    import torch
    from torch.utils import _pytree as pytree

    calls = []
    for sample in samples:
        leaves, spec = pytree.tree_flatten((sample.input, sample.args, dict(sample.kwargs)))
        calls.append((leaves, spec, [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]))

    class OpCall(torch.nn.Module):
        def forward(self, *tensors: Any) -> Any:
            outputs, taken = [], 0
            for leaves, spec, tensor_at in calls:
                filled = list(leaves)
                for i in tensor_at:
                    filled[i], taken = tensors[taken], taken + 1
                first, args, kwargs = pytree.tree_unflatten(filled, spec)
                outputs.append(op.op(first, *args, **kwargs))
            return tuple(outputs)

    inputs = tuple(leaves[i] for leaves, _, tensor_at in calls for i in tensor_at)
    return OpCall(), inputs


def _eager(module: Any, inputs: tuple[Any, ...]) -> Any:
    import torch
    from torch.utils import _pytree as pytree

    try:
        first, second = module(*tuple(t.clone() for t in inputs)), module(*tuple(t.clone() for t in inputs))
    except Exception as err:  # a sample eager itself refuses (an op only for GPUs, say)
        raise Unjudged(f"eager fails: {type(err).__name__}") from err
    outputs = pytree.tree_leaves(first)
    if not outputs or not all(isinstance(t, torch.Tensor) for t in outputs):
        raise Unjudged("an output is not a tensor")
    if any(t.layout != torch.strided for t in (*outputs, *inputs)):
        raise Unjudged("sparse")
    if any(t.is_complex() for t in (*outputs, *inputs)):
        raise Unjudged("complex")
    for a, b in zip(outputs, pytree.tree_leaves(second), strict=True):
        if not torch.equal(a, b) and not (a.is_floating_point() and torch.allclose(a, b, equal_nan=True)):
            raise Unjudged("eager differs between two runs")
    return first


def _samples(op: Any, count: int) -> list[Any]:
    """The op's first `count` samples (float32, CPU) that hold a tensor to pass in."""
    import torch
    from torch.utils import _pytree as pytree

    found = []
    for index, sample in enumerate(op.sample_inputs("cpu", torch.float32)):
        if index >= count:
            break
        leaves = pytree.tree_leaves((sample.input, sample.args, dict(sample.kwargs)))
        if any(isinstance(leaf, torch.Tensor) for leaf in leaves):
            found.append(sample)
    return found


def judge(name: str, samples: int, cache: Path, out: Path) -> dict[str, Any]:
    """Compiles the op's samples as one model (one compile per op keeps `make opinfo` short)
    and checks every output against eager. A pass says whether kiln compiled the op into its
    own kernels or left calls to torch (aten fallbacks, counted by op)."""
    import torch
    from torch.utils import _pytree as pytree

    import kiln

    if _RANDOM.search(name):
        raise Unjudged("random by design")
    op = _find(name)
    if torch.float32 not in op.supported_dtypes("cpu"):
        raise Unjudged("no float32 on CPU")
    chosen = _samples(op, samples)
    if not chosen:
        raise Unjudged("no sample has a tensor input")
    module, inputs = _module_for(op, chosen)
    want = _eager(module, inputs)
    try:
        exported = torch.export.export(module, tuple(t.clone() for t in inputs), strict=False)
    except Exception as err:
        raise Unjudged(f"torch.export: {type(err).__name__}") from err
    # Note: OpInfo's wrapper seeds eager (fractional max pooling draws its windows), and
    # kiln's random numbers are its own, so such an op cannot be judged against eager.
    if any(torch.Tag.nondeterministic_seeded in getattr(n.target, "tags", ()) for n in exported.graph.nodes):
        raise Unjudged("random by design: calls a seeded random op")
    compiled = kiln.compile(module, tuple(t.clone() for t in inputs), target="cpu", out=out, cache_dir=cache)
    got = compiled(*tuple(t.clone() for t in inputs))
    for index, (got_one, want_one) in enumerate(zip(got, want, strict=True)):
        pairs = zip(pytree.tree_leaves(got_one), pytree.tree_leaves(want_one), strict=True)
        for k, (g, w) in enumerate(pairs):
            if g.shape != w.shape or g.dtype != w.dtype:
                return {"status": "fail", "error": f"sample {index} output {k}: {g.dtype}{list(g.shape)}, "
                                                   f"eager {w.dtype}{list(w.shape)}"}
            if not torch.allclose(g, w, rtol=RTOL, atol=ATOL, equal_nan=True) and not torch.equal(g, w):
                worst = float((g.double() - w.double()).abs().nan_to_num(1e30).max()) if g.numel() else 0.0
                return {"status": "fail", "error": f"sample {index} output {k}: differs by {worst:.3g}"}
    report = json.loads((out / "report.json").read_text())
    return {"status": "pass", "samples": len(chosen), "fallbacks": report.get("fallbacks", {}),
            "kernels": len(report.get("kernels", []))}


def judged(name: str, samples: int, cache: Path, out: Path) -> dict[str, Any]:
    """judge()'s result, with an unjudged op or kiln's failure as a result too."""
    started = time.perf_counter()
    try:
        found = judge(name, samples, cache, out)
    except Unjudged as why:
        found = {"status": "unjudged", "why": str(why)}
    except Exception as err:  # kiln's failure on this op is the finding
        traceback.print_exc()
        text = str(err).strip().splitlines()[0][:300] if str(err).strip() else ""
        found = {"status": "fail", "error": f"{type(err).__name__}: {text}"}
    found["seconds"] = round(time.perf_counter() - started, 1)
    return found


def _forked(name: str, args: argparse.Namespace) -> dict[str, Any]:
    def call() -> dict[str, Any]:
        return judged(name, args.samples, args.out / "cache", args.out / "builds" / name)

    found = run_forked(call, args.out / "logs" / f"{name}.log", args.timeout)
    if found["status"] == "timeout":
        found = {"status": "fail", "error": f"timeout after {args.timeout} s"}
    elif found["status"] == "crash":
        found = {"status": "fail", "error": f"crash: exit {found['exit']}"}
    return {"op": name} | found


def error_class(error: str) -> str:
    """A failure's class: its message with numbers, names and shapes blurred."""
    text = re.sub(r"'[^']*'|\"[^\"]*\"", "'…'", error)
    text = re.sub(r"\d+(\.\d+)?(e-?\d+)?", "N", text)
    return text[:120]


def summary(results: list[dict[str, Any]]) -> str:
    counts = Counter(r["status"] for r in results)
    judged = counts["pass"] + counts["fail"]
    compiled = sum(1 for r in results if r["status"] == "pass" and not r.get("fallbacks"))
    # only torch's: fallbacks and not one kiln kernel (a matmul's extern call counts as kiln's)
    only_torch = sum(1 for r in results
                     if r["status"] == "pass" and r.get("fallbacks") and not r.get("kernels"))

    def share(part: int, whole: int) -> str:
        return f"{100 * part / whole:.1f}%" if whole else "-"

    return (f"opinfo: {counts['pass']} of {judged} judged ops pass ({share(counts['pass'], judged)}); "
            f"{compiled} of the {counts['pass']} passing compile to kiln kernels alone, no aten fallback "
            f"({share(compiled, counts['pass'])}); {counts['pass'] - only_torch} have kiln kernels, not only "
            f"fallbacks ({share(counts['pass'] - only_torch, counts['pass'])}); {counts['unjudged']} not "
            f"judged, of {len(results)}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ops", help="comma-separated op names (default: every op, or --sample of them)")
    p.add_argument("--sample", type=int, help="this many ops, drawn with --seed")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--samples", type=int, default=3, help="sample inputs per op")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    p.add_argument("--timeout", type=int, default=300, help="seconds per op")
    p.add_argument("--out", type=Path, default=ROOT / "build" / "opinfo")
    p.add_argument("--classes", action="store_true", help="count the failures by class at the end")
    args = p.parse_args(argv)
    names = args.ops.split(",") if args.ops else op_names()
    if args.sample:
        names = sorted(random.Random(args.seed).sample(names, min(args.sample, len(names))))
    (args.out / "logs").mkdir(parents=True, exist_ok=True)
    op_names()  # the database is imported once, here, and every fork shares it
    results = run_all(names, lambda name: _forked(name, args), args.jobs)
    (args.out / "opinfo.json").write_text(json.dumps(results, indent=1))
    if args.classes:
        failures = Counter(error_class(r["error"]) for r in results if r["status"] == "fail")
        for cls, n in failures.most_common():
            print(f"{n:4d}  {cls}")
        left = Counter(op for r in results if r["status"] == "pass" for op in r.get("fallbacks", {}))
        print("aten fallbacks in passing ops:", ", ".join(f"{op} ({n})" for op, n in left.most_common()))
    print(summary(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
