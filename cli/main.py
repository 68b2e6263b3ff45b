"""The `kiln` command line: compile, report, run, bench, explain, stages, cache."""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from contract.config import load_config
from contract.errors import KilnError
from contract.facts import TARGETS, default_target
from pipeline.stages import STAGES, stage_names

_err = Console(stderr=True, highlight=False)
_out = Console(highlight=False)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kiln", description="Ahead-of-time compiler for PyTorch models")
    p.add_argument("--cache-dir", type=Path, help="cache folder (default: $KILN_CACHE_DIR or ~/.cache/kiln)")
    p.add_argument("--debug", action="store_true", help="show tracebacks and worker logs")
    sub = p.add_subparsers(dest="command", required=True)

    c = sub.add_parser("compile", help="compile a model (configs/MODEL.toml)")
    _model_args(c)
    c.add_argument("--force", action="append", default=[], choices=stage_names(), metavar="STAGE",
                   help="rerun STAGE even if cached (repeatable)")
    c.add_argument("--until", choices=stage_names(), metavar="STAGE", help="stop after STAGE")
    c.add_argument("--in-process", action="store_true", help="run stages in this process")
    _executor_arg(c)
    c.add_argument("--quiet", action="store_true", help="no live display")

    r = sub.add_parser("report", help="print the last compile report of a model")
    _model_args(r)
    run = sub.add_parser("run", help="run a build on random inputs; compare with eager")
    _model_args(run)
    run.add_argument("--repeat", type=int, default=20, help="timed calls (median reported)")
    _bench_args(sub.add_parser("bench", help="kiln against eager, torch.compile and AOTInductor"))
    e = sub.add_parser("explain", help="say which stages would rerun, and why")
    _model_args(e)
    _executor_arg(e)  # a cluster's GPU keys the cuda target's tuning, as this host's does here
    sub.add_parser("stages", help="list the stage table")

    cache = sub.add_parser("cache", help="inspect or trim the cache")
    csub = cache.add_subparsers(dest="cache_command", required=True)
    csub.add_parser("info", help="entries and bytes per stage")
    cl = csub.add_parser("clear", help="delete everything in the cache (waits for running compiles)")
    cl.add_argument("--no-wait", action="store_true", help="refuse, rather than wait, while compiles run")
    g = csub.add_parser("gc", help="trim to a size, keeping what the latest builds use")
    g.add_argument("--max-size", required=True, help="e.g. 500M, 2G")
    g.add_argument("--include-latest", action="store_true",
                   help="also trim what the latest builds use (never what running compiles hold)")
    return p


def _executor_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--executor", choices=("local", "slurm"),
                   help="where per-kernel tuning runs (default: $KILN_EXECUTOR, else the config's "
                        "[executor] table, else local); slurm takes the table's settings or "
                        "$KILN_SLURM_PARTITION, _GRES, _TIME_MIN, _QUEUE_MIN, _ACCOUNT, _JOBS, "
                        "_EXCLUSIVE, _GPU, _ARCH")


def _model_args(p: argparse.ArgumentParser, out_help: str = "build folder (default: build/MODEL)") -> None:
    p.add_argument("model", help="a config name in configs/ (e.g. mlp) or a .toml path")
    p.add_argument("--target", choices=TARGETS, help="cpu or cuda (default: cuda if a GPU is visible)")
    p.add_argument("--out", type=Path, help=out_help)


# bench/suite.py's ENGINES and RECOMPILES (spelt with "-" here), not imported: `kiln --help` stays cheap
BENCH_ENGINES = ("kiln", "eager", "torch.compile", "aoti", "torch.compile:reduce-overhead",
                 "torch.compile:max-autotune")  # the last two: cuda only (bench/suite.py)
BENCH_RECOMPILES = ("warm", "weight-swap", "layer-edit")


def _picks(known: tuple[str, ...], allow_none: bool) -> Callable[[str], tuple[str, ...]]:
    """A parser of a comma-separated subset of known (or "none", where allowed)."""

    def parse(text: str) -> tuple[str, ...]:
        picked = tuple(dict.fromkeys(name.strip() for name in text.split(",") if name.strip()))
        if allow_none and picked == ("none",):
            return ()
        if not picked or any(name not in known for name in picked):
            raise argparse.ArgumentTypeError(f"pick from {','.join(known)}; got {text!r}")
        return picked

    return parse


def _bench_args(p: argparse.ArgumentParser) -> None:
    _model_args(p, out_help="folder of bench.json, bench.png and kiln's builds "
                            "(default: build/bench/MODEL-TARGET)")
    p.add_argument("--engines", type=_picks(BENCH_ENGINES, False), default=None, metavar="LIST",
                   help=f"comma-separated, from {','.join(BENCH_ENGINES)} (default: all; "
                        "the torch.compile modes with CUDA graphs are cuda's only)")
    p.add_argument("--recompiles", type=_picks(BENCH_RECOMPILES, True), default=BENCH_RECOMPILES,
                   metavar="LIST", help=f"after the cold compile, from {','.join(BENCH_RECOMPILES)}, "
                                        "or none (default: all; warm is every engine's, the edits kiln's)")
    p.add_argument("--runs", type=int, default=50, help="timed calls per engine (median reported)")
    p.add_argument("--warmup", type=int, default=10, help="untimed calls before them")
    p.add_argument("--threads", type=int, default=0, help="CPU threads for every process (default: torch's)")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds for any one process")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return _dispatch(args)
    except KilnError as err:
        # Note: messages quote TOML tables ([model], [[inputs]]) and paths, which rich would read
        # as markup and drop: escape what the user wrote, keep kiln's own styling.
        _err.print(f"[bold red]kiln: error:[/] {escape(err.message)}")
        if err.hint:
            _err.print(f"  [dim]hint:[/] {escape(err.hint)}")
        if args.debug and err.detail:
            _err.print(err.detail, markup=False)
        if args.debug:
            traceback.print_exc()
        return 1
    except KeyboardInterrupt:
        _err.print("[yellow]kiln: interrupted; the cache is unchanged[/]")
        return 130


def _dispatch(args: argparse.Namespace) -> int:
    from cli import commands

    if args.command == "stages":
        for stage in STAGES:
            targets = "/".join(stage.targets)
            status = f"built ({targets})" if stage.built else f"not built ({stage.planned})"
            _out.print(f"{stage.name:16} {status:26} {stage.summary}")
        return 0
    if args.command == "cache":
        return commands.cache_command(args, _out)
    config = load_config(args.model)
    target = args.target or _config_target(config.field("model.device"))
    if args.command == "bench":
        out = args.out or Path.cwd() / "build" / "bench" / f"{config.name}-{target}"
        return commands.bench_command(args, config, target, out, _out)
    out = args.out or Path.cwd() / "build" / config.name
    if args.command == "compile":
        return commands.compile_command(args, config, target, out, _out, _err)
    if args.command == "report":
        return commands.report_command(out, _out)
    if args.command == "run":
        return commands.run_command(config, out, args.repeat, _out)
    return commands.explain_command(args, config, target, out, _out)


def _config_target(device: str) -> str:
    return default_target() if device == "auto" else device


if __name__ == "__main__":
    sys.exit(main())
