"""Compile reports as data: report.json and a Chrome trace (trace.json, opens in Perfetto) in
the build folder. kiln/report.py prints them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cache.hashing import pretty_json
from contract.timings import LIBRARY, TimingRecord, fused_kernels, read_timings
from pipeline.runner import BuildResult, StageRow
from pipeline.worker import STAGE_IMPORTS

REPORT = "report.json"
TRACE = "trace.json"


def report_json(result: BuildResult) -> dict[str, Any]:
    return {
        "model": result.model,
        "target": result.target,
        "seconds": round(result.seconds, 4),
        "stages": [
            {**row.to_json(), "seconds": round(row.seconds, 4), "start": round(row.start, 4),
             **_parts(result, row)}
            for row in result.rows
        ],
        "warnings": result.warnings,
        "kernels": kernel_rows(result),
        "fallbacks": fallbacks(result),
    }


_PART_ORDER = (STAGE_IMPORTS, "model imports", "construction", "export", "decompositions", "serialization")


def _parts(result: BuildResult, row: StageRow) -> dict[str, Any]:
    """Where a stage that ran spent its seconds, where it says (trace: construction, export,
    decompositions, serialization; the worker adds its stage imports); the rest is the worker's
    start (the interpreter) and the runner's commit."""
    entry = result.entries.get(row.stage)
    said = entry.meta.get("notes", {}).get("seconds") if entry is not None and row.status == "ran" else None
    if not isinstance(said, dict) or not said:
        return {}
    ordered = sorted(said, key=lambda k: (_PART_ORDER.index(k) if k in _PART_ORDER else len(_PART_ORDER), k))
    parts = [[str(k), round(float(said[k]), 4)] for k in ordered]
    rest = row.seconds - sum(float(said[k]) for k in ordered)
    parts.append(["worker start, commit", round(max(0.0, rest), 4)])
    return {"parts": parts}  # pairs, in order: report.json's keys are sorted


def fallbacks(result: BuildResult) -> dict[str, int]:
    """The aten ops left to torch, with how many calls of each (lower's count), {} if none."""
    lowered = result.entries.get("lower")
    found = lowered.meta.get("notes", {}).get("fallbacks", {}) if lowered is not None else {}
    return {str(op): int(n) for op, n in found.items()} if isinstance(found, dict) else {}


def _variant_text(record: TimingRecord) -> str:
    """cpu: the variant's name; cuda: the variant and its config (XBLOCK, RBLOCK, warps)."""
    config = record.config
    text = record.variant  # a cpu variant, or a cuda matmul pair's library calls, has no config
    if "XBLOCK" in config:
        text += f" X{config['XBLOCK']} R{config['RBLOCK']} w{config['num_warps']}"
    if not record.tuned:
        return f"{text} (untuned)"
    return f"{text} (settled)" if record.extra.get("settled") else text


def kernel_rows(result: BuildResult) -> list[dict[str, Any]]:
    """One row per tuned kernel: variant chosen, its time, gain over the default variant and
    share of all kernels' time (each distinct kernel counted once per launch)."""
    tuned = result.entries.get("autotune")
    if tuned is None or "timings.json" not in tuned.artifacts:
        return []
    records = read_timings(json.loads(tuned.file("timings.json").read_text()))
    fused = fused_kernels(records)
    rows: list[dict[str, Any]] = []
    for key, r in records.items():
        names = [n for n in r.names if n not in fused]
        if r.names and not names:  # every launch runs inside a matmul template
            continue
        # Note: a matmul pair whose library calls won times the call and its epilogue kernel,
        # which has a row of its own: the pair's row takes no share of kernel time.
        counted = r.variant != LIBRARY
        rows.append({"kernel": (names or [key[:16]])[0], "origins": ", ".join(r.origins),
                     "launches": len(names) or 1, "variant": _variant_text(r), "counted": counted,
                     "config": dict(r.config), "seconds": r.seconds, "gain": r.gain, "tuned": r.tuned,
                     "places": list(r.places), "tuned_on": str(r.extra.get("where", ""))})
    total = sum((row["seconds"] or 0) * row["launches"] for row in rows if row["counted"])
    for row in rows:
        part = (row["seconds"] or 0) * row["launches"]
        row["share"] = round(part / total, 4) if row.pop("counted") and total else None
    return sorted(rows, key=lambda row: (-(row["share"] or 0), row["kernel"]))


def chrome_trace(report: dict[str, Any]) -> dict[str, Any]:
    events = [
        {
            "name": row["stage"],
            "cat": row["status"],
            "ph": "X",
            "ts": int(row["start"] * 1e6),
            "dur": max(1, int(row["seconds"] * 1e6)),
            "pid": 1,
            "tid": 2 if row.get("beside") else 1,  # overlapping slices on one track do not nest
            "args": {k: row[k] for k in ("status", "key", "bytes", "peak_rss", "note")},
        }
        for row in report["stages"]
        if row["status"] not in ("not built", "skipped")
    ]
    meta = {"name": "process_name", "ph": "M", "pid": 1, "args": {"name": f"kiln {report['model']}"}}
    return {"traceEvents": [meta, *events], "displayTimeUnit": "ms"}


def report_files(result: BuildResult) -> dict[str, str]:
    """The reports a build folder holds, by file name."""
    report = report_json(result)
    return {REPORT: pretty_json(report), TRACE: json.dumps(chrome_trace(report), indent=1) + "\n"}


def read_report(out: Path) -> dict[str, Any]:
    return dict(json.loads((out / REPORT).read_text()))
