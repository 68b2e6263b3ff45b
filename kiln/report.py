"""The report printed after every compile (and by `kiln report`): the stage table and the
kernel table, from report.json's data (pipeline/report.py). The CLI and the benchmarks print
it; so may a user, from a Build's report."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from contract.units import human_bytes

__all__ = ["human_bytes", "kernel_table", "print_report", "report_table"]

_STYLE = {"ran": "green", "hit": "cyan", "cutoff": "blue", "not built": "dim", "skipped": "dim"}


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
        for part, seconds in row.get("parts", []):
            table.add_row(f"  {escape(part)}", "", f"{seconds:.2f}", "", "", "")
    table.caption = f"total {report['seconds']:.2f} s"
    return table


KERNEL_ROWS = 12  # the rest are summed in one line


def kernel_table(rows: list[dict[str, Any]]) -> Table:
    table = Table(title=f"kernels ({len(rows)} distinct), by share of kernel time", title_justify="left")
    # Note: a "where" column only for a model with control flow: where each kernel's launches
    # sit (a branch, a loop body), so a branch the example inputs never take shows as tuned.
    where = any(place != "main" for row in rows for place in row.get("places", []))
    remote = any(row.get("tuned_on") for row in rows)  # tuned by cluster jobs (--executor slurm)
    columns = [("kernel", "left"), *([("where", "left")] if where else []), ("launches", "right"),
               ("variant", "left"), *([("tuned on", "left")] if remote else []), ("us", "right"),
               ("gain", "right"), ("share", "right")]
    for col, justify in columns:
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for row in rows[:KERNEL_ROWS]:
        seconds, gain, share = row["seconds"], row["gain"], row["share"]
        origins = f" ({row['origins']})" if row.get("origins") else ""
        places = [escape(", ".join(row.get("places", [])))] if where else []
        tuned_on = [escape(row.get("tuned_on") or "here")] if remote else []
        table.add_row(escape(row["kernel"] + origins), *places, str(row["launches"]), escape(row["variant"]),
                      *tuned_on, f"{seconds * 1e6:.1f}" if seconds is not None else "-",
                      f"{gain:.2f}x" if gain else "-", f"{share:.0%}" if share is not None else "-")
    rest = rows[KERNEL_ROWS:]
    if rest:
        share = sum(row["share"] or 0 for row in rest)
        launches = sum(row["launches"] for row in rest)
        blank = [""] if where else []
        table.add_row(f"... {len(rest)} more", *blank, str(launches), "", *([""] if remote else []), "", "",
                      f"{share:.0%}")
    return table


def print_report(report: dict[str, Any], console: Console | None = None) -> None:
    console = console or Console()
    console.print(report_table(report))
    if report.get("kernels"):
        console.print(kernel_table(report["kernels"]))
    if report.get("fallbacks"):
        calls = ", ".join(f"{op} x{n}" for op, n in report["fallbacks"].items())
        console.print(f"[yellow]left to torch (aten fallback):[/] {escape(calls)}")
    for warning in report.get("warnings", []):
        console.print(f"[yellow]warning:[/] {escape(warning)}")
