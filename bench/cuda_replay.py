"""CUDA graph replay, measured (not a timed test; needs a GPU):
`python3 bench/cuda_replay.py [MODEL ...] [--runs N] [--dtype D] [--matmul M,...] [--layout L,...]
[--no-torch]`.

For each model (default: mlp bert gpt2 resnet18), compiled once for cuda (a cache of the run's
own), in one process: the latency of kiln's model.so with direct launches (graphs=False) and
with its runs replayed as CUDA graphs of its kernels only (KILN_CUDA_GRAPHS=kernels) and of its
kernels and calls into torch (the default), and of torch.compile in mode
"reduce-overhead" (CUDA graphs too) and the default mode, on the same module (the kiln build's
weights) and inputs. Each latency is the median of --runs calls, each timed with CUDA events
from an idle GPU, so the host's launch time shows; the error is the largest abs difference
from eager. Prints a table and what kiln's replay did (CompiledModel.replay).

--layout names the builds' lower.layout the same way (`--layout auto,traced`: channels-last
conv nets against the traced layouts).

--matmul names the builds' tuning.matmul (auto, template, library; the first is the build the
other engines use): with `--matmul library,auto`, each model is also replayed as the build with
no matmul template and as the one where tuning chose, side by side; each build's matmul pairs
are listed with the variant that won and its gain over the library's calls.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DEFAULT_MODELS = ("mlp", "bert", "gpt2", "resnet18")


def median_ms(call: Callable[[], Any], runs: int, warmup: int = 5) -> float:
    import torch

    for _ in range(warmup):
        call()
    torch.cuda.synchronize()
    times = []
    for _ in range(runs):
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        start.record()
        call()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return float(statistics.median(times))


def max_error(got: Any, want: Any) -> float:
    from kiln.run_model import flat_tensors

    return max((float((a.float() - b.float()).abs().max()) for a, b in
                zip(flat_tensors(got), flat_tensors(want), strict=True)), default=0.0)


def in_dtype(config: Any, dtype: str) -> Any:
    """The config with its model and its float inputs in `dtype` (the reference configs are
    float32; issue 23's figures are float16's)."""
    import torch

    inputs = [{**spec, "dtype": dtype} if getattr(torch, spec["dtype"]).is_floating_point else spec
              for spec in config.fields["inputs"]]
    return replace(config, fields={**config.fields, "model.dtype": dtype, "inputs": inputs})


Variant = tuple[str, dict[str, str]]  # a build's label ("matmul=auto") and its config fields


def variants(matmul: tuple[str, ...], layout: tuple[str, ...]) -> list[Variant]:
    """The first of each list together (the build every engine uses), then each other mode of
    one field with the first of the other."""
    first = {"tuning.matmul": matmul[0], "lower.layout": layout[0]}
    return [("", first),
            *((f"matmul={m}", {**first, "tuning.matmul": m}) for m in matmul[1:]),
            *((f"layout={v}", {**first, "lower.layout": v}) for v in layout[1:])]


def bench_model(name: str, root: Path, runs: int, with_torch: bool, dtype: str,
                builds: list[Variant]) -> dict[str, Any]:
    import torch

    from kiln import compile_config, load_config
    from kiln.loader import load
    from kiln.run_model import eager_model, random_inputs

    row: dict[str, Any] = {"model": name, "dtype": dtype}
    config = in_dtype(load_config(name), dtype)
    outs = {}
    for label, fields in builds:
        outs[label] = root / f"{name}-{label or 'first'}"
        build = compile_config(replace(config, fields={**config.fields, **fields}),
                               target="cuda", out=outs[label], cache_dir=root / "cache")
        rows = build.report["kernels"]
        row[f"pairs ({label or 'first'})"] = [f"{r['kernel']} {r['variant']} {r['gain'] or 0:.2f}x"
                                              for r in rows if r["kernel"].startswith("mm_")]
        row[f"kernels ({label or 'first'})"] = len(rows)
    out = outs[""]
    model = eager_model(config, out).cuda()
    inputs = tuple(v.cuda() for v in random_inputs(config, 1))
    engines: dict[str, Callable[..., Any]] = {
        "kiln direct": load(out, graphs=False), "kiln replay kernels": _kernels_only(out),
        "kiln replay": load(out, graphs=True)}
    engines |= {f"kiln replay ({label})": load(outs[label], graphs=True) for label, _ in builds[1:]}
    if with_torch:
        engines["torch.compile"] = torch.compile(model)
        engines["torch.compile:reduce-overhead"] = torch.compile(model, mode="reduce-overhead")
    with torch.no_grad():
        want = model(*inputs)
        row["eager ms"] = median_ms(lambda: model(*inputs), runs)
        for engine, fn in engines.items():
            row[f"{engine} ms"] = median_ms(lambda fn=fn: fn(*inputs), runs)  # type: ignore[misc]
            row[f"{engine} error"] = max_error(fn(*inputs), want)
    row["replay"] = engines["kiln replay"].replay  # type: ignore[attr-defined]
    return row


def _kernels_only(out: Path) -> Any:
    """The build replayed with only kiln's kernels in its graphs (KILN_CUDA_GRAPHS=kernels)."""
    import os

    from kiln.loader import load

    os.environ["KILN_CUDA_GRAPHS"] = "kernels"
    try:
        return load(out)
    finally:
        del os.environ["KILN_CUDA_GRAPHS"]


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="*", default=list(DEFAULT_MODELS))
    p.add_argument("--runs", type=int, default=100)
    p.add_argument("--dtype", default="float16", choices=("float16", "bfloat16", "float32"),
                   help="the models' and their float inputs' dtype (default float16, as issue 23 measures)")
    p.add_argument("--matmul", default="library", help="comma-separated tuning.matmul modes, a build each "
                   "(auto, template, library; default library): the first is the kiln build of every engine")
    p.add_argument("--layout", default="auto", help="comma-separated lower.layout modes, a build each "
                   "(auto, traced; default auto), as --matmul")
    p.add_argument("--no-torch", action="store_true", help="kiln only (no torch.compile)")
    args = p.parse_args(argv)
    modes, layouts = tuple(args.matmul.split(",")), tuple(args.layout.split(","))
    if not set(modes) <= {"auto", "template", "library"}:
        p.error(f"--matmul takes auto, template and library, got {args.matmul!r}")
    if not set(layouts) <= {"auto", "traced"}:
        p.error(f"--layout takes auto and traced, got {args.layout!r}")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            try:
                rows.append(bench_model(name, Path(tmp), args.runs, not args.no_torch, args.dtype,
                                         variants(modes, layouts)))
            except Exception as err:  # one model's failure is a row, not the end of the run
                rows.append({"model": name, "error": f"{type(err).__name__}: {str(err)[:300]}"})
            print(rows[-1], flush=True)
    for row in rows:
        ms = {k: v for k, v in row.items() if k.endswith(" ms")}
        times = " ".join(f"{k}={v:.3f}" for k, v in ms.items())
        print(row["model"], row.get("dtype", ""), times, row.get("error", ""))
        if "kiln replay ms" in row:
            replay = row["kiln replay ms"]
            versus = row.get("torch.compile:reduce-overhead ms")
            print("   replay/direct", f"{replay / row['kiln direct ms']:.2f}",
                  f"replay/reduce-overhead {replay / versus:.2f}" if versus else "", "|", row["replay"])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
