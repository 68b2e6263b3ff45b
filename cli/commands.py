"""The bodies of the CLI's commands (kept apart from argument parsing)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from cache import gc as cache_gc
from cache.store import write_atomic
from cli.progress import LiveDisplay
from contract.config import ModelConfig
from contract.errors import KilnError
from contract.units import human_bytes
from kiln.report import print_report
from pipeline.build import Cache, compile_model, default_cache_root
from pipeline.codedeps import forget_scans
from pipeline.explain import explain
from pipeline.explain import summary as explain_summary
from pipeline.progress import Display, QuietDisplay
from pipeline.report import read_report, report_json
from pipeline.runner import BuildOptions

_RERUN_STYLE = {"no": "green", "yes": "yellow", "maybe": "blue", "not built": "dim"}


def _cache(args: argparse.Namespace, display: Display | None = None) -> Cache:
    root = args.cache_dir.resolve() if args.cache_dir else default_cache_root()
    return Cache.open(root, display)


def compile_command(
    args: argparse.Namespace,
    config: ModelConfig,
    target: str,
    out: Path,
    console: Console,
    err: Console,
) -> int:
    options = BuildOptions(target, out, frozenset(args.force), args.until, args.in_process,
                           executor=args.executor)
    live = not args.quiet and err.is_terminal
    display: Display = LiveDisplay(err) if live else QuietDisplay(err)
    cache = _cache(args, display)
    if isinstance(display, LiveDisplay):
        with display:
            result = compile_model(config, options, cache, display)
    else:
        result = compile_model(config, options, cache, display)
    print_report(report_json(result), console)
    return 0


def _clear(cache: Cache, no_wait: bool, console: Console) -> None:
    def waiting(owners: tuple[int, ...]) -> None:
        pids = ", ".join(map(str, owners))
        console.print(f"waiting for {len(owners)} running compile(s) to finish (pid {pids}); "
                      "Ctrl-C leaves the cache as it is")

    try:
        cache_gc.clear(cache.store, cache.records, None if no_wait else waiting)
    except cache_gc.CacheBusy as busy:
        raise KilnError(f"cannot clear {cache.root}: {busy}",
                        "wait for them to finish, or run kiln cache clear without --no-wait") from None
    console.print(f"cleared {escape(str(cache.root))}")


def report_command(out: Path, console: Console) -> int:
    try:
        report = read_report(out)
    except FileNotFoundError:
        raise KilnError(f"no report in {out}", "compile the model first: kiln compile MODEL") from None
    print_report(report, console)
    return 0


def run_command(config: ModelConfig, out: Path, repeat: int, console: Console) -> int:
    from kiln.run_model import run_build

    result = run_build(config, out, repeat)
    console.print(escape(f"{config.name}: {out} on random inputs ({', '.join(result.inputs)})"))
    console.print(f"  max abs error vs eager: {result.max_error:.3g}")
    ratio = result.kiln_seconds / result.eager_seconds if result.eager_seconds else float("nan")
    kiln_ms, eager_ms = result.kiln_seconds * 1e3, result.eager_seconds * 1e3
    console.print(f"  latency: kiln {kiln_ms:.3f} ms, eager {eager_ms:.3f} ms"
                  f" ({ratio:.2f}x eager's time; median of {repeat})")
    return 0


def bench_command(args: argparse.Namespace, config: ModelConfig, target: str, out: Path,
                  console: Console) -> int:
    """kiln, eager, torch.compile and AOTInductor on one model (bench/suite.py): the table,
    kiln's compile profile, out/bench.json and out/bench.png."""
    from bench.chart import write_chart
    from bench.render import print_bench
    from bench.suite import ENGINES, BenchOptions, engines_for, run_bench

    if args.runs < 1 or args.warmup < 0:
        raise KilnError("--runs must be at least 1 and --warmup at least 0")
    recompiles = tuple(step.replace("-", "_") for step in args.recompiles)
    engines = engines_for(target, args.engines or ENGINES, explicit=args.engines is not None)
    options = BenchOptions(str(config.path), target, out.resolve(), engines=engines,
                           recompiles=recompiles, runs=args.runs, warmup=args.warmup, timeout=args.timeout,
                           threads=args.threads)
    bench = run_bench(options, partial=lambda so_far: _write_bench(out / "bench.json", so_far))
    _write_bench(out / "bench.json", bench)
    print_bench(bench, console)
    console.print(escape(f"\nwrote {out / 'bench.json'}"))
    console.print(escape(write_chart(bench, out / "bench.png")))
    return 0


def _write_bench(path: Path, bench: dict[str, Any]) -> None:
    write_atomic(path, json.dumps(bench, indent=2) + "\n")


def explain_command(
    args: argparse.Namespace, config: ModelConfig, target: str, out: Path, console: Console
) -> int:
    cache = _cache(args)
    options = BuildOptions(target, out, executor=args.executor)
    verdicts = explain(config, options, cache.store, cache.records)
    for verdict in verdicts:
        style = _RERUN_STYLE.get(verdict.rerun, "white")
        console.print(f"[bold]{verdict.stage:16}[/] [{style}]rerun: {verdict.rerun}[/]")
        for reason in verdict.reasons:
            console.print(f"    {escape(reason)}")
    if line := explain_summary(verdicts):
        console.print(escape(line))
    return 0


def cache_command(args: argparse.Namespace, console: Console) -> int:
    cache = _cache(args)
    if args.cache_command == "info":
        found = cache_gc.info(cache.store, cache.records)
        console.print(f"cache: {escape(str(cache.root))}")
        for stage, (count, size) in sorted(found.entries.items()):
            console.print(f"  {stage:24} {count:5} entries  {human_bytes(size):>10}")
        console.print(f"  {'records':24} {'':5}          {human_bytes(found.records_bytes):>10}")
        console.print(f"  total {human_bytes(found.total)}")
    elif args.cache_command == "clear":
        _clear(cache, args.no_wait, console)
    else:
        try:
            limit = cache_gc.parse_size(args.max_size)
        except ValueError as e:
            raise KilnError(str(e)) from None
        res = cache_gc.gc(cache.store, cache.records, limit, include_latest=args.include_latest)
        forget_scans(cache.records)
        console.print(
            f"removed {res.removed} entries ({human_bytes(res.freed)}) and {res.locks_removed} unused lock "
            f"files; cache now {human_bytes(res.kept_bytes)}, of which {human_bytes(res.protected_bytes)} "
            f"is used by the latest builds and {human_bytes(res.leased_bytes)} held by running compiles"
        )
        if res.kept_bytes > limit and not args.include_latest:
            console.print("  to trim below what the latest builds use: kiln cache gc --include-latest")
    return 0
