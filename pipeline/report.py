"""Compile reports: the rich table printed after every compile, report.json and a Chrome
trace (trace.json, opens in Perfetto) in the build folder."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from rich.console import Console
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
    }


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


def write_reports(result: BuildResult) -> dict[str, Any]:
    report = report_json(result)
    result.out.mkdir(parents=True, exist_ok=True)
    _atomic_write(result.out / REPORT, pretty_json(report))
    _atomic_write(result.out / TRACE, json.dumps(chrome_trace(report), indent=1) + "\n")
    return report


def read_report(out: Path) -> dict[str, Any]:
    return dict(json.loads((out / REPORT).read_text()))


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(text)
    tmp.replace(path)


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
            row["note"] or (row["key"][:12] if shown else ""),
        )
    table.caption = f"total {report['seconds']:.2f} s"
    return table


def print_report(report: dict[str, Any], console: Console | None = None) -> None:
    console = console or Console()
    console.print(report_table(report))
    for warning in report.get("warnings", []):
        console.print(f"[yellow]warning:[/] {warning}")
