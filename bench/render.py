"""What `kiln bench` prints: one row per engine, the errors and notes, then where kiln's compile
time went (its cold compile's stage and kernel tables, and each recompile's stages)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.suite import NOT_REACHED
from kiln.report import human_bytes, print_report

ENGINE_TITLES = {"kiln": "kiln", "eager": "eager", "torch.compile": "torch.compile", "aoti": "AOTInductor",
                 "torch.compile:reduce-overhead": "torch.compile reduce-overhead",
                 "torch.compile:max-autotune": "torch.compile max-autotune"}
STEP_TITLES = {"cold": "cold compile", "warm": "warm compile", "layer_edit": "one-layer edit",
               "weight_swap": "weight swap", "latency": "latency"}
RECOMPILES = ("cold", "warm", "weight_swap", "layer_edit")


def _seconds(value: float) -> str:
    return f"{value:.2f}"


def _bytes(value: float) -> str:
    return human_bytes(int(value))


def _ms(value: float) -> str:
    return f"{value:.3f}" if value >= 0.01 else f"{value:.2e}"


def _error(value: float) -> str:
    return f"{value:.1e}"


Column = tuple[str, str, str, Callable[[float], str]]  # title, step, key in the step, format
COLUMNS: tuple[Column, ...] = (
    ("cold s", "cold", "seconds", _seconds),
    ("warm s", "warm", "seconds", _seconds),
    ("1-layer edit s", "layer_edit", "seconds", _seconds),
    ("weight swap s", "weight_swap", "seconds", _seconds),
    ("peak RSS", "cold", "peak_rss_bytes", _bytes),
    ("peak GPU", "cold", "peak_gpu_bytes", _bytes),
    ("latency ms", "latency", "median_ms", _ms),
    ("max abs err", "latency", "max_abs_error", _error),
)


def cell(step: dict[str, Any], key: str, fmt: Callable[[float], str]) -> str:
    """A number, "error" (the message is listed under the table) or "-" (skipped, not applicable)."""
    if "error" in step:
        return "[red]error[/]"
    value = step.get(key)
    if isinstance(value, int | float) and not isinstance(value, bool):
        return fmt(value)
    return "[dim]-[/]"


def summary_table(bench: dict[str, Any]) -> Table:
    machine = bench["machine"]
    where = machine.get("gpu") if bench["target"] == "cuda" else machine.get("cpu")
    table = Table(title=f"kiln bench {bench['model']} (target {bench['target']}; {where}; torch "
                        f"{machine.get('torch', '?')})", title_justify="left")
    columns = [c for c in COLUMNS if bench["target"] == "cuda" or c[0] != "peak GPU"]
    table.add_column("engine")
    for title, *_ in columns:
        table.add_column(title, justify="right")
    for engine, steps in bench["engines"].items():
        cells = [cell(steps[step], key, fmt) for _, step, key, fmt in columns]
        table.add_row(ENGINE_TITLES.get(engine, engine), *cells)
    timer = "CUDA events" if bench["target"] == "cuda" else "perf_counter"
    table.caption = (f"compile: wall seconds of a fresh process up to compiled and ready; peaks: the cold "
                     f"compile's. latency: median of {bench['runs']} calls after {bench['warmup']} "
                     f"({timer}; {bench['threads'] or 'default'} threads); error: max abs vs eager")
    return table


def notes(bench: dict[str, Any]) -> list[str]:
    """Every error, kiln's edits, why a kiln step was skipped, and the engines a cut run did
    not reach."""
    lines = []
    for engine, steps in bench["engines"].items():
        if all(found == NOT_REACHED for found in steps.values()):
            lines.append(f"{ENGINE_TITLES.get(engine, engine)}: {NOT_REACHED['skipped']}")
            continue
        for step, found in steps.items():
            what = f"{ENGINE_TITLES.get(engine, engine)} {STEP_TITLES.get(step, step)}"
            if "error" in found:
                lines.append(f"[red]{what}: error:[/] {found['error']}")
            elif engine == "kiln" and "skipped" in found:
                lines.append(f"{what}: skipped: {found['skipped']}")
            elif "edit" in found:
                lines.append(f"{what}: {found['edit']}")
    return lines


def recompile_table(kiln: dict[str, Any]) -> Table:
    """Per kiln compile of this run, each stage's status and seconds."""
    done = [step for step in RECOMPILES if "stages" in kiln.get(step, {})]
    stages = list(kiln["cold"]["stages"])
    table = Table(title="kiln's compiles in this run: status and seconds per stage", title_justify="left")
    table.add_column("compile")
    for stage in stages:
        table.add_column(stage)
    table.add_column("total s", justify="right")
    for step in done:
        rows = kiln[step]["stages"]
        table.add_row(STEP_TITLES[step], *(stage_cell(rows.get(stage)) for stage in stages),
                      _seconds(kiln[step]["seconds"]))
    table.caption = "ran: computed; hit: cached; cutoff: reran upstream wrote the same bytes, so no new key"
    return table


def stage_cell(row: dict[str, Any] | None) -> str:
    if row is None:
        return "-"
    return f"ran {row['seconds']:.2f}" if row["status"] == "ran" else row["status"]


def print_bench(bench: dict[str, Any], console: Console) -> None:
    console.print(summary_table(bench))
    for line in notes(bench):
        console.print(line)
    kiln = bench["engines"]["kiln"]
    report = kiln["cold"].get("report")
    if report is None:
        console.print("\nkiln's compile profile: none (kiln's cold compile did not run)")
        return
    console.print("\nwhere kiln's compile time went (its cold compile in this run):")
    print_report(report, console)
    console.print(recompile_table(kiln))
