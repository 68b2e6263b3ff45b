"""A stand-in for a stage's prebuild module (pipeline/prebuild.py): `python -m tests.fake_prebuild
ROOT` sleeps in a child of its own (the compilers a real build starts), or exits with the status
that ROOT/status names."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from cache.store import Store

WHAT = "fake item"


def is_cached(store: Store, code: str) -> bool:
    return (store.root / "cached").exists()


def main(argv: list[str]) -> int:
    status = Path(argv[0]) / "status"
    if status.exists():
        return int(status.read_text())
    (Path(argv[0]) / "child.pid").write_text("")
    child = subprocess.Popen(["sleep", "60"])
    (Path(argv[0]) / "child.pid").write_text(str(child.pid))
    child.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
