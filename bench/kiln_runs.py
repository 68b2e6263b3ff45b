"""`kiln compile` as the benchmarks run it: a fresh process on a given cache, and what its
report.json, timings.json and weights file say afterwards."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

from bench.procs import ERROR_CHARS, error_text, run_measured
from bench.report_table import ratio

_MB = 2**20


def kiln_compile(config: Path | str, target: str, out: Path, env: dict[str, str],
                 timeout: float) -> dict[str, Any]:
    """One `kiln compile` (the cache is env's KILN_CACHE_DIR): its wall seconds, peak RSS, each
    stage's status and seconds, and the report; or {"error": ...}."""
    cmd = [sys.executable, "-m", "kiln", "compile", str(config), "--quiet", "--target", target,
           "--out", str(out)]
    done = run_measured(cmd, env, timeout)
    failed = done.failure("kiln compile")
    if failed is not None:
        return {"error": failed, "seconds": done.seconds}
    try:
        report = json.loads((out / "report.json").read_text())
    except (OSError, ValueError) as err:
        return {"error": error_text(err), "seconds": done.seconds}
    return {"seconds": done.seconds, "peak_rss_bytes": done.peak_rss_bytes, "stages": stage_summary(report),
            "report": report}


def stage_rows(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {row["stage"]: row for row in report.get("stages", [])}


def stage_summary(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per stage: its status (ran, hit, cutoff, ...), seconds, note and whether it ran in a worker
    the stage server forked."""
    rows = stage_rows(report)
    return {name: {"status": row["status"], "seconds": row["seconds"], "note": row.get("note", ""),
                   "served": bool(row.get("served"))} for name, row in rows.items()}


def stage_seconds(report: dict[str, Any]) -> dict[str, float]:
    return {name: row["seconds"] for name, row in stage_rows(report).items() if row.get("status") == "ran"}


def link_row(report: dict[str, Any]) -> dict[str, Any]:
    row = stage_rows(report).get("link", {})
    ran = row.get("status") == "ran"
    return {"link_s": row.get("seconds") if ran else None, "link_status": row.get("status"),
            "link_note": row.get("note")}


def compile_memory(out: Path, report: dict[str, Any]) -> dict[str, Any]:
    """The autotune stage's GPU memory (timings.json and its report note) and the weights' bytes."""
    try:
        records: dict[str, Any] = json.loads((out / "timings.json").read_text())
        weights = weight_bytes(out / "weights.safetensors")
    except (OSError, ValueError, KeyError) as err:
        return {"error": f"{type(err).__name__}: {err}"[-ERROR_CHARS:]}
    peak = largest_of(records, "peak_bytes")
    largest = largest_of(records, "inputs_bytes")
    note = str(stage_rows(report).get("autotune", {}).get("note") or "")
    noted = re.search(r"peak ([\d.]+) MB", note)
    return {"peak_bytes": peak, "peak_mb": mb(peak), "largest_inputs_bytes": largest,
            "peak_over_largest": ratio(peak, largest), "kernels": len(records),
            "note_peak_mb": float(noted.group(1)) if noted else None, "autotune_note": note,
            "weight_bytes": weights, "weight_mb": mb(weights)}


def largest_of(records: dict[str, Any], field: str) -> int | None:
    """The largest value of a field over timings.json's records; None where no record has it (a
    compile without a GPU writes untuned records)."""
    values = [r[field] for r in records.values() if isinstance(r.get(field), int)]
    return max(values, default=None)


def weight_bytes(path: Path) -> int:
    """The bytes of every tensor in a safetensors file, from its header (8-byte length, JSON)."""
    with path.open("rb") as f:
        size = int.from_bytes(f.read(8), "little")
        header: dict[str, Any] = json.loads(f.read(size))
    spans = [entry["data_offsets"] for name, entry in header.items() if name != "__metadata__"]
    return sum(end - start for start, end in spans)


def mb(n: float | None) -> float | None:
    return None if n is None else round(n / _MB, 2)


def program_digest(cache: Path, report: dict[str, Any]) -> str:
    """The digest of the exported program a compile's trace stage wrote (in the cache at cache)."""
    key = report["stages"][0]["key"]
    meta = json.loads((cache / "store" / "objects" / "trace" / key / "meta.json").read_text())
    return str(meta["artifacts"]["program.json"]["xxh3_128"])
