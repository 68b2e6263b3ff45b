"""Compiling generated C++ on the host: the flags every CPU kernel and wrapper is built with."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

RUNTIME = Path(__file__).resolve().parents[2] / "runtime"
# Note: no -ffast-math: kiln must give eager's NaN and infinity behaviour; -O3 with
# -march=native would tie a build to this machine's CPU, so tuning picks variants, not flags.
FLAGS = ("-std=c++17", "-O3", "-fPIC", "-shared", "-fopenmp", "-fno-math-errno")


def compiler() -> str:
    found = shutil.which("g++") or shutil.which("c++")
    if found is None:
        raise RuntimeError("no C++ compiler (g++) on PATH")
    return found


def build_shared(source: Path, out: Path, include: tuple[Path, ...] = ()) -> None:
    cmd = [compiler(), *FLAGS, f"-I{RUNTIME}", *(f"-I{p}" for p in include), str(source), "-o", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"C++ build of {source.name} failed:\n{proc.stderr[-4000:]}")
