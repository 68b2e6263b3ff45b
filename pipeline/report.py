"""Compile reports: the rich table printed after every compile, report.json and a Chrome
trace (trace.json, opens in Perfetto) in the build folder."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from cache.hashing import pretty_json
from pipeline.runner import BuildResult

REPORT = "report.json"
TRACE = "trace.json"
_STYLE = {"ran": "green", "hit": "cyan", "cutoff": "blue", "not built": "dim", "skipped": "dim"}


def report_json(result: BuildResult) -> dict[str, Any]:
    return {
        "model": result.model,
        "target": result.target,
        "seconds": round(result.seconds, 4),
        "stages": [
            {**row.to_json(), "seconds": round(row.seconds, 4), "start": round(row.start, 4)}
            for row in result.rows
        ],
        "warnings": result.warnings,
        "kernels": kernel_rows(result),
    }


def _variant_text(record: dict[str, Any]) -> str:
    """cpu: the variant's name; cuda: the variant and its config (XBLOCK, RBLOCK, warps)."""
    config = record.get("config") or {}
    if "XBLOCK" not in config:
        return str(record.get("variant", "-"))
    text = f"{record.get('variant')} X{config['XBLOCK']} R{config['RBLOCK']} w{config['num_warps']}"
    return text if record.get("tuned") else f"{text} (untuned)"


def kernel_rows(result: BuildResult) -> list[dict[str, Any]]:
    """One row per tuned kernel: variant chosen, its time, gain over the default variant and
    share of all kernels' time (each distinct kernel counted once per launch)."""
    tuned, generated = result.entries.get("autotune"), result.entries.get("gen-tuning-code")
    if tuned is None or generated is None or "timings.json" not in tuned.artifacts:
        return []
    records = json.loads(tuned.file("timings.json").read_text())
    spec = json.loads(generated.file("kernels.json").read_text())["kernels"]
    names = {k["key"]: k["names"] for k in spec}
    origins = {k["key"]: ", ".join(k.get("origins", [])) for k in spec}
    rows = []
    for key, r in records.items():
        seconds = r.get("timings", {}).get(r.get("label") or r.get("variant"))
        launches = len(names.get(key, [])) or 1
        rows.append({"kernel": names.get(key, [key[:16]])[0], "origins": origins.get(key, ""),
                     "launches": launches, "variant": _variant_text(r),
                     "config": r["config"], "seconds": seconds, "gain": r["gain"], "tuned": r["tuned"],
                     "places": r.get("places", [])})
    total = sum((row["seconds"] or 0) * row["launches"] for row in rows)
    for row in rows:
        row["share"] = round((row["seconds"] or 0) * row["launches"] / total, 4) if total else None
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
            "tid": 1,
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


def human_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    if n < 1024:
        return f"{n} B"
    value = float(n)
    for unit in ("KB", "MB"):
        value /= 1024
        if value < 1024:
            return f"{value:.1f} {unit}"
    return f"{value / 1024:.1f} GB"


def report_table(report: dict[str, Any]) -> Table:
    title = f"kiln compile {report['model']} (target {report['target']})"
    table = Table(title=title, title_justify="left")
    for col, justify in [("stage", "left"), ("status", "left"), ("seconds", "right"),
                         ("output", "right"), ("peak RSS", "right"), ("note", "left")]:
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for row in report["stages"]:
        status = row["status"]
        shown = status not in ("not built", "skipped")
        table.add_row(
            row["stage"],
            f"[{_STYLE.get(status, 'red')}]{status}[/]",
            f"{row['seconds']:.2f}" if shown else "",
            human_bytes(row["bytes"]) if shown else "",
            human_bytes(row["peak_rss"]) if shown else "",
            escape(row["note"] or (row["key"][:12] if shown else "")),
        )
    table.caption = f"total {report['seconds']:.2f} s"
    return table


KERNEL_ROWS = 12  # the rest are summed in one line


def kernel_table(rows: list[dict[str, Any]]) -> Table:
    table = Table(title=f"kernels ({len(rows)} distinct), by share of kernel time", title_justify="left")
    # Note: a "where" column only for a model with control flow: where each kernel's launches
    # sit (a branch, a loop body), so a branch the example inputs never take shows as tuned.
    where = any(place != "main" for row in rows for place in row.get("places", []))
    columns = [("kernel", "left"), *([("where", "left")] if where else []), ("launches", "right"),
               ("variant", "left"), ("us", "right"), ("gain", "right"), ("share", "right")]
    for col, justify in columns:
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for row in rows[:KERNEL_ROWS]:
        seconds, gain, share = row["seconds"], row["gain"], row["share"]
        origins = f" ({row['origins']})" if row.get("origins") else ""
        places = [escape(", ".join(row.get("places", [])))] if where else []
        table.add_row(escape(row["kernel"] + origins), *places, str(row["launches"]), escape(row["variant"]),
                      f"{seconds * 1e6:.1f}" if seconds is not None else "-",
                      f"{gain:.2f}x" if gain else "-", f"{share:.0%}" if share is not None else "-")
    rest = rows[KERNEL_ROWS:]
    if rest:
        share = sum(row["share"] or 0 for row in rest)
        launches = sum(row["launches"] for row in rest)
        blank = [""] if where else []
        table.add_row(f"... {len(rest)} more", *blank, str(launches), "", "", "", f"{share:.0%}")
    return table


def print_report(report: dict[str, Any], console: Console | None = None) -> None:
    console = console or Console()
    console.print(report_table(report))
    if report.get("kernels"):
        console.print(kernel_table(report["kernels"]))
    for warning in report.get("warnings", []):
        console.print(f"[yellow]warning:[/] {escape(warning)}")
