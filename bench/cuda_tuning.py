"""CUDA tuning benchmark (not a timed test; needs a GPU): `python bench/cuda_tuning.py [MODEL]`.

In one run: the autotune stage's seconds for MODEL (default bert) cold (fresh cache) and warm
(a recompile), kernel counts, the peak GPU memory of tuning against the largest kernel's
inputs and outputs, and for the memory-bound kernels (layer norm, softmax, GELU) the bandwidth
each tuned kernel reaches as a fraction of a device-to-device copy of the same bytes, both
timed here with CUDA events.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MEMORY_BOUND = ("layer_norm", "softmax", "gelu")


def _compile(model: str, batch: int | None, cache: Path, out: Path) -> dict[str, Any]:
    from pipeline.build import Cache, compile_model
    from pipeline.config import load_config
    from pipeline.runner import BuildOptions

    config = load_config(model)
    if batch is not None:  # the same model on a larger batch: kernels that are not launch-bound
        specs = config.field("inputs")
        config.fields["inputs"] = [dict(spec, shape=[batch, *spec["shape"][1:]]) for spec in specs]
    opened = Cache.open(cache)
    result = compile_model(config, BuildOptions("cuda", out), opened)
    row = next(r for r in result.rows if r.stage == "autotune")
    entry = result.entries["autotune"]
    return {"status": row.status, "seconds": row.seconds, "note": row.note,
            "records": json.loads(entry.file("timings.json").read_text()),
            "kernels_json": str(result.entries["gen-tuning-code"].file("kernels.json"))}


def _copy_seconds(nbytes: int) -> float:
    import torch

    from tasks.tune.cuda_tune import _seconds

    src = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda")
    dst = torch.empty_like(src)

    class Copy:
        def __getitem__(self, grid: Any) -> Any:
            return lambda *args, **kwargs: dst.copy_(src)

    entry = {"xnumel": 1, "rnumel": 1}
    return _seconds(Copy(), entry, [], {"XBLOCK": 1, "RBLOCK": 1, "num_warps": 1, "num_stages": 1})


def _touched(entry: dict[str, Any], tensor: Any) -> int:
    """Bytes a kernel can move for one parameter: all of it, or at most one element per point of
    its loop nest (a gather reads a few rows of an embedding table, not the table)."""
    points = entry["xnumel"] * entry["rnumel"]
    return int(min(tensor.untyped_storage().nbytes(), points * tensor.element_size()))


def _bandwidth(kernels_json: Path, records: dict[str, Any]) -> list[dict[str, Any]]:
    from tasks.tune import cuda_tune

    spec = json.loads(kernels_json.read_text())
    rows = []
    for entry in spec["kernels"]:
        origins = " ".join(entry.get("origins", []))
        if not any(word in origins for word in MEMORY_BOUND):
            continue
        record = records[entry["key"]]
        module = cuda_tune.load_module(kernels_json.parent / spec["folder"] / entry["file"])
        inputs = cuda_tune.random_inputs(entry["params"], "cuda")
        nbytes = sum(_touched(entry, t) for t in inputs)
        seconds = cuda_tune._seconds(getattr(module, record["function"]), entry, inputs, record["config"])
        copy = _copy_seconds(nbytes // 2)  # a copy of n/2 bytes reads n/2 and writes n/2: n moved
        rows.append({"kernel": entry["kernel"], "origins": origins, "bytes": nbytes,
                     "gb_per_s": nbytes / seconds / 1e9, "copy_gb_per_s": nbytes / copy / 1e9,
                     "fraction_of_copy": copy / seconds})
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("model", nargs="?", default="bert")
    parser.add_argument("--batch", type=int, help="the config's inputs with this batch size")
    parser.add_argument("--json", type=Path, default=ROOT / "build" / "bench-cuda-tuning.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["KILN_CACHE_DIR"] = str(Path(tmp) / "cache")
        cold = _compile(args.model, args.batch, Path(tmp) / "cache", Path(tmp) / "a")
        warm = _compile(args.model, args.batch, Path(tmp) / "cache", Path(tmp) / "b")
        records = cold["records"]
        peak = max(r.get("peak_bytes", 0) for r in records.values())
        largest = max(r.get("inputs_bytes", 0) for r in records.values())
        bandwidth = _bandwidth(Path(cold["kernels_json"]), records)
    result = {"model": args.model, "batch": args.batch, "cold_seconds": cold["seconds"],
              "cold_note": cold["note"],
              "warm_status": warm["status"], "warm_seconds": warm["seconds"], "kernels": len(records),
              "peak_gpu_bytes": peak, "largest_kernel_bytes": largest,
              "peak_over_largest": peak / largest if largest else None, "bandwidth": bandwidth}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
