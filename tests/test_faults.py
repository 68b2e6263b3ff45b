"""The fault suite: a crash, a second process or a damaged file never breaks a build or hands back
wrong bytes. Each case does what a user (or a disk) did, then checks what a user would: the
command still works, and the build loads and matches eager, or is refused by name."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from cache import gc as cache_gc
from cache.leases import Lease
from cache.records import Records
from cli import main as cli
from contract.config import load_config
from contract.errors import KilnError
from kiln.loader import load
from kiln.run_model import eager_model, flat_tensors, random_inputs
from pipeline.build import Cache, compile_model
from pipeline.publish import publish, remove_litter
from pipeline.report import report_files
from pipeline.runner import BuildOptions, BuildResult
from pipeline.stages import STAGES
from tests.conftest import python_path


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("faults")


@pytest.fixture(scope="module")
def cache(root: Path) -> Iterator[Cache]:
    c = Cache.open(root / "cache")
    yield c
    c.records.close()


def _compile(cache: Cache, out: Path, name: str = "mlp", seed: int | None = None,
             until: str | None = None, force: frozenset[str] = frozenset()) -> BuildResult:
    config = load_config(name)
    if seed is not None:
        config.fields["weights.seed"] = seed
    return compile_model(config, BuildOptions("cpu", out, force, until=until), cache)


@pytest.fixture(scope="module")
def mlp(root: Path, cache: Cache) -> Path:
    out = root / "mlp"
    _compile(cache, out)
    return out


def _outputs(build: Path, seed: int = 0) -> list[torch.Tensor]:
    config = load_config("mlp")
    return flat_tensors(load(build)(*random_inputs(config, seed)))


def _eager(pristine: Path) -> list[torch.Tensor]:
    config = load_config("mlp")
    return flat_tensors(eager_model(config, pristine)(*random_inputs(config, 0)))


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.allclose(x, y, rtol=1e-4, atol=1e-4) for x, y in zip(a, b, strict=True))


# -- the records database ---------------------------------------------------------------------

def test_a_damaged_records_database_is_moved_aside_once(tmp_path: Path, capsys: Any) -> None:
    cache_dir = tmp_path / "cache"
    records = Records(cache_dir / "records")
    records.set("build", "x", {"entries": []})
    records.close()
    with open(cache_dir / "records" / "cache.db", "r+b") as f:
        f.write(b"\0" * 4096)
    commands = (["cache", "info"], ["cache", "gc", "--max-size", "1K"],
                ["explain", "mlp", "--target", "cpu"], ["cache", "clear"], ["cache", "info"])
    for argv in commands:
        assert cli.main(["--cache-dir", str(cache_dir), *argv]) == 0, argv
    err = capsys.readouterr().err
    assert err.count("was damaged") == 1, err
    assert Records(cache_dir / "records").get("build", "x") is None  # a new, working database


# -- gc and clear beside compiles ---------------------------------------------------------------

def test_gc_never_deletes_what_a_running_compile_leased(mlp: Path, cache: Cache) -> None:
    entries = {f"{stage}/{key}" for stage, key, _ in cache.store.entries()}
    lease = Lease.open(cache.store.root)
    held = sorted(entries)[:3]
    for name in held:
        lease.hold(name)
    try:
        result = cache_gc.gc(cache.store, cache.records, 1, include_latest=True)
        left = {f"{stage}/{key}" for stage, key, _ in cache.store.entries()}
        assert left == set(held)
        assert result.leased_bytes > 0
    finally:
        lease.close()
    cache_gc.gc(cache.store, cache.records, 1, include_latest=True)
    assert not list(cache.store.entries())
    load(mlp)  # the build folder is its own bytes: trimming the cache leaves it whole
    _compile(cache, mlp)  # and the cache refills


def test_gc_keeps_the_latest_builds_unless_asked(tmp_path: Path) -> None:
    cache = Cache.open(tmp_path / "cache")
    _compile(cache, tmp_path / "mlp")
    (cache.store.root / "locks" / "orphan.lock").write_text("")
    kept = cache_gc.gc(cache.store, cache.records, 1)
    assert kept.removed == 0
    assert kept.protected_bytes > 0
    assert kept.locks_removed >= 1
    assert not (cache.store.root / "locks" / "orphan.lock").exists()
    trimmed = cache_gc.gc(cache.store, cache.records, 1, include_latest=True)
    assert trimmed.removed > 0
    assert trimmed.kept_bytes == 0


def test_clear_waits_for_a_running_compile_or_refuses(tmp_path: Path) -> None:
    cache = Cache.open(tmp_path / "cache")
    cache.store.objects.mkdir(parents=True)
    lease = Lease.open(cache.store.root)
    with pytest.raises(cache_gc.CacheBusy, match=f"pid {os.getpid()}"):
        cache_gc.clear(cache.store, cache.records)
    told: list[tuple[int, ...]] = []
    threading.Timer(0.5, lease.close).start()
    start = time.monotonic()
    cache_gc.clear(cache.store, cache.records, told.append, poll=0.05)
    assert time.monotonic() - start >= 0.4
    assert told == [(os.getpid(),)]
    assert not cache.store.objects.exists()


def test_gc_and_clear_beside_a_compile_in_another_process(tmp_path: Path) -> None:
    """A real compile, with gc trimming to nothing beside it the whole time: it succeeds, and
    its build loads and matches eager; a clear that may not wait says who runs."""
    cache_dir, out = tmp_path / "cache", tmp_path / "convnet"
    env = {**os.environ, "PYTHONPATH": python_path()}
    proc = subprocess.Popen([sys.executable, "-m", "kiln", "--cache-dir", str(cache_dir), "compile",
                             "convnet", "--target", "cpu", "--out", str(out), "--quiet"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    cache = Cache.open(cache_dir)
    refused = 0
    while proc.poll() is None:
        cache_gc.gc(cache.store, cache.records, 1, include_latest=True)
        try:
            cache_gc.clear(cache.store, cache.records)
        except cache_gc.CacheBusy:
            refused += 1
        time.sleep(0.05)
    assert proc.returncode == 0, proc.stderr.read().decode() if proc.stderr else ""
    assert refused > 0
    config = load_config("convnet")
    inputs = random_inputs(config, 1)
    got, want = flat_tensors(load(out)(*inputs)), flat_tensors(eager_model(config, out)(*inputs))
    assert _same(got, want)


# -- the build folder ---------------------------------------------------------------------------

def test_a_build_folder_is_its_own_bytes(root: Path, mlp: Path, cache: Cache) -> None:
    other = root / "mlp-copy"
    _compile(cache, other)
    for path in mlp.rglob("*"):
        if path.is_file():
            assert path.stat().st_nlink == 1, path
    before = _outputs(other)
    weights = mlp / "weights.safetensors"
    data = bytearray(weights.read_bytes())
    data[-4000:-3936] = bytes(64)
    weights.write_bytes(bytes(data))
    with pytest.raises(KilnError, match="does not match its digest"):
        load(mlp)
    assert _same(_outputs(other), before)  # the other folder is untouched
    _compile(cache, mlp)  # a recompile mends the edited folder
    assert _same(_outputs(mlp), before)


def test_a_folder_of_another_model_is_replaced_whole(root: Path, cache: Cache) -> None:
    out = root / "switch"
    _compile(cache, out, "convnet")
    _compile(cache, out)
    published = json.loads((out / "model.json").read_text())["files"]
    on_disk = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    assert on_disk == {*published, "model.json", "report.json", "trace.json", ".kiln-build.json"}
    assert not [p for p in root.iterdir() if p.name.startswith(".switch")]


def test_until_never_damages_a_complete_build(root: Path, mlp: Path, cache: Cache) -> None:
    before = {p.name: p.read_bytes() for p in mlp.iterdir() if p.is_file() and p.suffix != ".json"}
    result = _compile(cache, mlp, seed=11, until="weights")
    assert result.out == mlp.with_name("mlp.partial")
    assert any("holds a complete build" in w for w in result.warnings)
    after = {p.name: p.read_bytes() for p in mlp.iterdir() if p.is_file() and p.suffix != ".json"}
    assert after == before
    assert (result.out / "weights.safetensors").is_file()
    load(mlp)


def test_a_folder_kiln_did_not_write_is_refused(tmp_path: Path, cache: Cache) -> None:
    (tmp_path / "mine.txt").write_text("my notes")
    with pytest.raises(KilnError, match="holds files kiln did not write"):
        _compile(cache, tmp_path)
    assert (tmp_path / "mine.txt").read_text() == "my notes"


def _steps(result: BuildResult, over: Path) -> list[str]:
    """The steps of publishing `result` over a copy of the build `over`."""
    seen: list[str] = []
    scratch = result.out.with_name("steps")
    shutil.rmtree(scratch, ignore_errors=True)
    shutil.copytree(over, scratch)
    result.out = scratch
    publish(result, STAGES, lambda: report_files(result), seen.append)
    shutil.rmtree(scratch)
    return seen


def _publish_and_die(result: BuildResult, out: Path, step: str) -> int:
    pid = os.fork()
    if pid == 0:  # the child publishes, and is killed -9 as it reaches `step`
        def die(name: str) -> None:
            if name == step:
                os.kill(os.getpid(), signal.SIGKILL)

        result.out = out
        try:
            publish(result, STAGES, lambda: report_files(result), die)
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    return status


def test_kill_9_at_every_point_of_publish(root: Path, mlp: Path, cache: Cache) -> None:
    """Killed at each step of publishing a new build (other weights) over a good one: the folder
    loads, and holds the old build or the new one, each matching its own eager model; the next
    publish leaves no litter."""
    old = root / "kill-old"
    shutil.copytree(mlp, old)
    new_result = _compile(cache, root / "kill-new", seed=5)
    new = root / "kill-new-pristine"
    shutil.copytree(new_result.out, new)
    want_old, want_new = _eager(old), _eager(new)
    assert not _same(want_old, want_new)
    steps = _steps(new_result, old)
    assert len(steps) >= 20, steps
    seen = set()
    for step in steps:
        out = root / "kill"
        shutil.rmtree(out, ignore_errors=True)
        shutil.copytree(old, out)
        status = _publish_and_die(new_result, out, step)
        assert os.WIFSIGNALED(status), step
        assert os.WTERMSIG(status) == signal.SIGKILL, step
        got = _outputs(out)
        which = "old" if _same(got, want_old) else "new" if _same(got, want_new) else "neither"
        assert which != "neither", step
        seen.add(which)
        remove_litter(out)
        assert not [p for p in root.iterdir() if p.name.startswith(".kill.")], step
    assert seen == {"old", "new"}


# -- load() checks what it loads -----------------------------------------------------------------

def _damaged(root: Path, mlp: Path, name: str, how: str) -> Path:
    out = root / f"damaged-{name}-{how}"
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(mlp, out)
    path = out / name
    data = bytearray(path.read_bytes())
    if how == "truncated":
        data = data[: len(data) // 3]
    elif how == "flipped":
        for i in range(len(data) // 2, len(data) // 2 + 64):
            data[i] ^= 0xFF
    else:
        data = bytearray(os.urandom(len(data)))
    path.write_bytes(bytes(data))
    return out


@pytest.mark.parametrize("name", ["model.so", "weights.safetensors", "model.json"])
@pytest.mark.parametrize("how", ["truncated", "flipped", "garbage"])
def test_load_refuses_a_damaged_file_by_name(root: Path, mlp: Path, name: str, how: str) -> None:
    out = _damaged(root, mlp, name, how)
    code = f"from kiln.loader import load\nload({str(out)!r})"
    proc = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": python_path()},
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 1, proc.stderr[-2000:]  # an exception, never a signal
    raised = [line for line in proc.stderr.splitlines() if line.startswith("contract.errors.KilnError")]
    assert raised, proc.stderr[-2000:]
    assert name in raised[0], raised[0]


def test_verify_false_skips_digests_but_not_sizes(root: Path, mlp: Path) -> None:
    flipped = _damaged(root, mlp, "weights.safetensors", "flipped")
    load(flipped, verify=False)  # the user's choice: used unchecked
    truncated = _damaged(root, mlp, "model.so", "truncated")
    with pytest.raises(KilnError, match="truncated or replaced"):
        load(truncated, verify=False)


# -- the smaller items ------------------------------------------------------------------------------

def test_a_corrupt_autotune_item_is_recomputed_with_a_warning(tmp_path: Path) -> None:
    cache = Cache.open(tmp_path / "cache")
    _compile(cache, tmp_path / "a")
    items = [path for stage, _key, path in cache.store.entries() if stage == "autotune.items"]
    victim = next(p for p in sorted(items[0].iterdir()) if p.name not in ("meta.json", ".verified.json"))
    victim.chmod(0o644)
    victim.write_bytes(b"damaged")
    result = _compile(cache, tmp_path / "b", force=frozenset({"autotune"}))
    assert any("is corrupt" in w and "autotune.items" in w for w in result.warnings), result.warnings
