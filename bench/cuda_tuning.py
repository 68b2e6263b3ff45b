"""CUDA tuning benchmark (not a timed test; needs a GPU): `python bench/cuda_tuning.py [MODEL]`.

In one run: the autotune stage's seconds for MODEL (default bert) cold (fresh cache) and warm
(a recompile), kernel counts, the peak GPU memory of tuning against the largest kernel's
inputs and outputs, and for the memory-bound kernels (layer norm, softmax, GELU) the bandwidth
each tuned kernel reaches as a fraction of a device-to-device copy of the same bytes, both
timed here with CUDA events.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MEMORY_BOUND = ("layer_norm", "softmax", "gelu")


def _compile(model: str, batch: int | None, kwargs: dict[str, Any], cache: Path, out: Path) -> dict[str, Any]:
    from kiln import compile_config, load_config

    config = load_config(model)
    config.fields["model.kwargs"] = {**config.field("model.kwargs"), **kwargs}
    if batch is not None:  # the same model on a larger batch: kernels that are not launch-bound
        specs = config.field("inputs")
        config.fields["inputs"] = [dict(spec, shape=[batch, *spec["shape"][1:]]) for spec in specs]
    build = compile_config(config, target="cuda", out=out, cache_dir=cache)
    row = next(r for r in build.report["stages"] if r["stage"] == "autotune")
    return {"status": row["status"], "seconds": row["seconds"], "note": row["note"],
            "records": json.loads((build.out / "timings.json").read_text()),
            "kernels_json": str(build.out / "kernels.json")}


def _tuner(kernels_json: Path) -> Any:
    """The build folder's own tune.py (the tuner autotune ran, standalone): its timing harness."""
    spec = importlib.util.spec_from_file_location("kiln_build_tune", kernels_json.parent / "tune.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _copy_seconds(nbytes: int, seconds: Any) -> float:
    import torch

    src = torch.empty(max(1, nbytes // 4), dtype=torch.float32, device="cuda")
    dst = torch.empty_like(src)

    class Copy:
        def __getitem__(self, grid: Any) -> Any:
            return lambda *args, **kwargs: dst.copy_(src)

    entry = {"xnumel": 1, "rnumel": 1}
    one = {"XBLOCK": 1, "RBLOCK": 1, "num_warps": 1, "num_stages": 1}
    return float(seconds(Copy(), entry, {"tile": [1, 1]}, [], one))


def _touched(entry: dict[str, Any], tensor: Any) -> int:
    """Bytes a kernel can move for one parameter: all of it, or at most one element per point of
    its loop nest (a gather reads a few rows of an embedding table, not the table)."""
    points = entry["xnumel"] * entry["rnumel"]
    return int(min(tensor.untyped_storage().nbytes(), points * tensor.element_size()))


def _group(entry: dict[str, Any]) -> str:
    words = " ".join([entry["kernel"], *entry.get("origins", [])])
    return next((g for g in MEMORY_BOUND if g in words), "other")


def _sweep_configs(variant: dict[str, Any]) -> list[dict[str, int]]:
    """A wide grid of launch configs around the variant's own (for --sweep)."""
    rows, cols = variant["tile"]
    name = variant["name"]
    if name == "pointwise":
        grid = [(x, 1, w) for x in (256, 512, 1024, 2048, 4096, 8192) for w in (2, 4, 8, 16)]
    elif name == "persistent":
        r = variant["configs"][0]["RBLOCK"]
        grid = [(x, r, w) for x in (1, 2, 4, 8, 16, 32) for w in (1, 2, 4, 8, 16)]
    elif name == "looped":
        grid = [(x, r, w) for x in (1, 2, 4, 8) for r in (256, 512, 1024, 2048) for w in (4, 8, 16)]
    else:  # tiled
        grid = [(x, r, w) for x in (16, 32, 64, 128) for r in (16, 32, 64, 128) for w in (2, 4, 8)]
    return [{"XBLOCK": x, "RBLOCK": r, "num_warps": w, "num_stages": 1} for x, r, w in grid
            if x <= 2 * rows and (name != "tiled" or r <= 2 * cols) and 32 * w <= x * r <= 32768]


def _bandwidth(kernels_json: Path, records: dict[str, Any], sweep: bool) -> list[dict[str, Any]]:
    cuda_tune = _tuner(kernels_json)
    spec = json.loads(kernels_json.read_text())
    rows = []
    swept: set[str] = set()
    for entry in spec["kernels"]:
        record = records[entry["key"]]
        module = cuda_tune.load_module(kernels_json.parent / spec["folder"] / entry["file"])
        inputs = cuda_tune.random_inputs(entry["params"], "cuda")
        nbytes = sum(_touched(entry, t) for t in inputs)
        variant = next(v for v in entry["variants"] if v["name"] == record["variant"])
        fn = getattr(module, record["function"])
        took = cuda_tune.seconds(cuda_tune.compile_here(entry, fn, record["config"]), entry, variant, inputs,
                                record["config"])
        # a copy of n/2 bytes reads n/2 and writes n/2: n moved
        copy = _copy_seconds(nbytes // 2, cuda_tune.seconds)
        row = {"kernel": entry["kernel"], "group": _group(entry), "variant": record["variant"],
               "config": record["config"], "bytes": nbytes, "us": took * 1e6,
               "gb_per_s": nbytes / took / 1e9, "copy_gb_per_s": nbytes / copy / 1e9,
               "fraction_of_copy": copy / took}
        if sweep and row["group"] != "other" and row["group"] not in swept:
            row["sweep"] = _sweep(cuda_tune, module, entry, inputs, copy)  # the first kernel of each group
            swept.add(row["group"])
        rows.append(row)
        del inputs
    return rows


def _sweep(cuda_tune: Any, module: Any, entry: dict[str, Any], inputs: list[Any],
           copy: float) -> list[dict[str, Any]]:
    """The best few of a wide config grid for each variant, as fractions of the copy."""
    found = []
    for variant in entry["variants"]:
        fn = getattr(module, variant["function"])
        for config in _sweep_configs(variant):
            try:
                kernel = cuda_tune.compile_here(entry, fn, config)
                took = cuda_tune.seconds(kernel, entry, variant, inputs, config, repeat=20)
            except Exception:  # out of resources: not a candidate
                continue
            found.append({"variant": variant["name"], **config, "fraction_of_copy": round(copy / took, 3)})
    return sorted(found, key=lambda r: -float(r["fraction_of_copy"]))[:6]


def _summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per group (layer norm, softmax, GELU): the lowest and highest fraction of copy bandwidth."""
    out: dict[str, Any] = {}
    for group in MEMORY_BOUND:
        fractions = [r["fraction_of_copy"] for r in rows if r["group"] == group]
        if fractions:
            out[group] = {"kernels": len(fractions), "min": round(min(fractions), 3),
                          "max": round(max(fractions), 3)}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("model", nargs="?", default="bert")
    parser.add_argument("--batch", type=int, help="the config's inputs with this batch size")
    parser.add_argument("--eager-attention", action="store_true",
                        help="transformers' eager attention (a softmax kernel) instead of sdpa")
    parser.add_argument("--sweep", action="store_true",
                        help="also time a wide config grid for each memory-bound kernel")
    parser.add_argument("--json", type=Path, default=ROOT / "build" / "bench-cuda-tuning.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["KILN_CACHE_DIR"] = str(Path(tmp) / "cache")
        extra = {"attn_implementation": "eager"} if args.eager_attention else {}
        cold = _compile(args.model, args.batch, extra, Path(tmp) / "cache", Path(tmp) / "a")
        warm = _compile(args.model, args.batch, extra, Path(tmp) / "cache", Path(tmp) / "b")
        records = cold["records"]
        peak = max(r.get("peak_bytes", 0) for r in records.values())
        largest = max(r.get("inputs_bytes", 0) for r in records.values())
        bandwidth = _bandwidth(Path(cold["kernels_json"]), records, args.sweep)
    result = {"model": args.model, "batch": args.batch, "cold_seconds": cold["seconds"],
              "cold_note": cold["note"],
              "warm_status": warm["status"], "warm_seconds": warm["seconds"], "kernels": len(records),
              "peak_gpu_bytes": peak, "largest_kernel_bytes": largest,
              "peak_over_largest": peak / largest if largest else None,
              "memory_bound": _summary(bandwidth), "bandwidth": bandwidth}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
