"""cache/: canonical JSON, the store's atomic writes and checks, gc sizes, key stability."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cache import Store, canonical_json, digest_json
from cache.gc import parse_size
from contract.config import PROJECT_ROOT
from tests.conftest import python_path


def test_canonical_json_is_order_independent_and_exact() -> None:
    assert canonical_json({"b": 1, "a": [0.1, 2]}) == canonical_json({"a": [0.1, 2], "b": 1})
    assert canonical_json({"x": 0.1}) == b'{"x":0.1}'
    assert json.loads(canonical_json({"x": 1 / 3}))["x"] == 1 / 3
    with pytest.raises(ValueError, match="nan"):
        canonical_json({"x": float("nan")})


def test_store_commit_is_atomic_and_read_only(tmp_path: Path) -> None:
    store = Store(tmp_path)
    with store.staging("s", "k" * 64) as folder:
        (folder / "a.txt").write_text("hello")
        (folder / "sub").mkdir()
        (folder / "sub" / "b.txt").write_text("world")
        entry = store.commit(folder, "s", "k" * 64, {"parts": {}})
    assert sorted(entry.artifacts) == ["a.txt", "sub/b.txt"]
    assert not (entry.file("a.txt").stat().st_mode & 0o222)
    assert list((tmp_path / "tmp").iterdir()) == []
    again = store.lookup("s", "k" * 64)
    assert again is not None
    assert again.artifacts == entry.artifacts


def test_failed_write_leaves_nothing(tmp_path: Path) -> None:
    store = Store(tmp_path)
    def failing_stage() -> None:
        with store.staging("s", "k" * 64) as folder:
            (folder / "a.txt").write_text("partial")
            raise RuntimeError("stage failed")

    with pytest.raises(RuntimeError):
        failing_stage()
    assert store.lookup("s", "k" * 64) is None
    assert list((tmp_path / "tmp").iterdir()) == []


def test_missing_artifact_is_corrupt(tmp_path: Path) -> None:
    warnings: list[str] = []
    store = Store(tmp_path, warn=warnings.append)
    with store.staging("s", "k" * 64) as folder:
        (folder / "a.txt").write_text("x")
        entry = store.commit(folder, "s", "k" * 64, {})
    entry.file("a.txt").unlink()
    assert store.lookup("s", "k" * 64) is None
    assert warnings
    assert "missing" in warnings[0]
    assert not entry.path.exists()


@pytest.mark.parametrize(
    ("text", "size"), [("4096", 4096), ("500M", 500 << 20), ("1.5GiB", int(1.5 * (1 << 30))),
                       ("2g", 2 << 30), ("10KB", 10 << 10)],
)
def test_parse_size(text: str, size: int) -> None:
    assert parse_size(text) == size


def test_parse_size_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="cannot read"):
        parse_size("lots")


_KEY_SCRIPT = """
import sys
from contract.config import load_config
from pipeline.keys import key_of, static_parts
from pipeline.stages import STAGES
config = load_config("mlp")
print(key_of(static_parts(STAGES[0], config, "cpu", {})))
"""


def test_keys_are_stable_across_processes() -> None:
    keys = {
        subprocess.run([sys.executable, "-c", _KEY_SCRIPT], capture_output=True, text=True,
                       check=True, cwd=PROJECT_ROOT, env={"PYTHONPATH": python_path(),
                                                          "PYTHONHASHSEED": str(seed)}).stdout
        for seed in (1, 2)
    }
    assert len(keys) == 1
    assert len(keys.pop().strip()) == 64


def test_digest_json_distinguishes_values() -> None:
    assert digest_json({"a": 1}) != digest_json({"a": 2})
