"""A cuda model's runs replayed as CUDA graphs (runtime/kiln_replay.h; gpu marker, needs CUDA):
the same results as direct launches, outputs the caller keeps, inputs anywhere, a caller's
stream, calls into torch captured in the model's own memory pool, and replay off where it must
be."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from contract.config import load_config
from pipeline.build import Cache, compile_model
from pipeline.runner import BuildOptions

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("cuda-replay")
    cache = Cache.open(root / "cache")
    import importlib.util

    for name in ("mlp", "bert", "cond", "convnet"):
        if name != "bert" or importlib.util.find_spec("transformers") is not None:
            compile_model(load_config(name), BuildOptions("cuda", root / name), cache)
    yield root
    cache.records.close()


def _inputs(name: str, seed: int) -> tuple[Any, ...]:
    from kiln.run_model import random_inputs

    return tuple(v.cuda() for v in random_inputs(load_config(name), seed))


def _same(got: object, want: object) -> None:
    import torch

    from kiln.run_model import flat_tensors

    for a, b in zip(flat_tensors(got), flat_tensors(want), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("name", ["mlp", "bert", "convnet"])
@pytest.mark.parametrize("mode", ["all", "kernels"])
def test_replayed_runs_give_the_results_of_direct_launches_bit_for_bit(
        name: str, mode: str, builds: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kiln.loader import load

    if not (builds / name).is_dir():
        pytest.skip(f"{name} needs transformers")
    monkeypatch.setenv("KILN_CUDA_GRAPHS", mode)
    direct, replayed = load(builds / name, graphs=False), load(builds / name)
    assert direct.replay == "off: KILN_CREATE_NO_GRAPHS"
    assert replayed.replay.startswith("on: the first run records")
    for seed in (1, 2, 3):  # the first run records, the others replay
        inputs = _inputs(name, seed)
        _same(replayed(*inputs), direct(*inputs))
    said = replayed.replay
    assert said.startswith("on: "), said
    assert "CUDA graph" in said
    if mode == "all":  # matmuls, attention and convolutions in the graphs, in the model's pool
        assert "calls into torch captured" in said
        assert "run directly" not in said, said
    elif name != "mlp":  # torch's calls run between the graphs
        assert ("attention x" if name == "bert" else "convolution x") in said, said


def test_a_replay_writes_no_memory_torch_has_handed_out_since(builds: Path) -> None:
    """The blocks torch's calls used while recording stay the model's: tensors made after it,
    and torch's own CUDA graph capture (which clears cuBLAS's workspaces), are left alone."""
    import torch

    from kiln.loader import load

    for name in ("convnet", "bert"):
        if not (builds / name).is_dir():
            continue
        direct, replayed = load(builds / name, graphs=False), load(builds / name, graphs=True)
        replayed(*_inputs(name, 0))  # records
        held = [torch.full((n,), 7.0, device="cuda") for n in (1 << 10, 1 << 16, 1 << 20, 1 << 22)]
        a = torch.randn(256, 256, device="cuda")
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            product = a @ a
        graph.replay()
        for seed in (1, 2):
            inputs = _inputs(name, seed)
            _same(replayed(*inputs), direct(*inputs))
        torch.cuda.synchronize()
        assert all(bool((t == 7.0).all()) for t in held)
        assert torch.equal(product, a @ a)


def test_outputs_of_two_runs_held_at_once_are_both_right(builds: Path) -> None:
    from kiln.loader import load

    direct, replayed = load(builds / "mlp", graphs=False), load(builds / "mlp", graphs=True)
    replayed(*_inputs("mlp", 0))  # records
    first, second = _inputs("mlp", 1), _inputs("mlp", 2)
    kept_first = replayed(*first)
    kept_second = replayed(*second)
    _same(kept_first, direct(*first))
    _same(kept_second, direct(*second))


def test_inputs_at_new_addresses_and_a_callers_stream(builds: Path) -> None:
    import torch

    from kiln.loader import load

    direct, replayed = load(builds / "mlp", graphs=False), load(builds / "mlp", graphs=True)
    (x,) = _inputs("mlp", 4)
    replayed(x.clone())
    stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    for scale in (1.0, -2.0, 0.5):
        moved = (x * scale).clone()  # a new tensor each time
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            got = replayed(moved)
        stream.synchronize()
        _same(got, direct(moved))
    wide = torch.empty(x.shape[0], x.shape[1] * 2, device="cuda", dtype=x.dtype)[:, ::2]
    wide.copy_(x)  # other strides: staged, then replayed
    _same(replayed(wide), direct(x))


def test_a_callers_own_capture_takes_the_runs_launches(builds: Path) -> None:
    """Inside torch.cuda.graph the model launches directly, into the caller's graph."""
    import torch

    from kiln.loader import load

    direct, replayed = load(builds / "mlp", graphs=False), load(builds / "mlp", graphs=True)
    (x,) = _inputs("mlp", 5)
    replayed(x)  # records its own graphs first
    side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        replayed(x)  # torch.cuda.graph's advice: a warm-up on a side stream
    torch.cuda.current_stream().wait_stream(side)
    graph, static_x = torch.cuda.CUDAGraph(), x.clone()
    with torch.cuda.graph(graph):
        static_y = replayed(static_x)
    static_x.copy_(x * 2)
    graph.replay()
    torch.cuda.synchronize()
    _same(static_y, direct(x * 2))


def test_replay_is_off_for_control_flow_and_when_asked(builds: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kiln.loader import load

    cond = load(builds / "cond", graphs=True)
    assert cond.replay.startswith("off: the model's control flow")
    cond(*_inputs("cond", 0))
    monkeypatch.setenv("KILN_CUDA_GRAPHS", "0")
    assert load(builds / "mlp").replay == "off: KILN_CREATE_NO_GRAPHS"


def test_a_first_run_inside_another_pool_keeps_the_other_pools_blocks_unwritten(builds: Path) -> None:
    """Recorded inside a caller's use_mem_pool: the recording's allocations go to the model's
    own pool (the hook checks where they land), or, where torch would route them to the caller's,
    the hook fails and torch's calls run directly. Either way the caller's pool is never written
    by a replay."""
    import torch

    from kiln.loader import load

    direct, replayed = load(builds / "convnet", graphs=False), load(builds / "convnet", graphs=True)
    theirs = torch.cuda.MemPool()
    inputs = _inputs("convnet", 0)
    with torch.cuda.use_mem_pool(theirs):
        _same(replayed(*inputs), direct(*inputs))
    said = replayed.replay
    assert ("calls into torch captured" in said) != ("pool hook returned a failure" in said), said
    with torch.cuda.use_mem_pool(theirs):
        held = [torch.full((n,), 7.0, device="cuda") for n in (1 << 10, 1 << 16, 1 << 20, 1 << 22)]
    for seed in (1, 2):
        more = _inputs("convnet", seed)
        _same(replayed(*more), direct(*more))
    torch.cuda.synchronize()
    assert all(bool((t == 7.0).all()) for t in held)


def test_a_pool_hook_is_refused_after_the_first_run(builds: Path) -> None:
    """Its recording decided what its graphs hold; a hook set later would not match them."""
    from kiln import cuda_pool
    from kiln.loader import load

    model = load(builds / "mlp", graphs=True)
    model(*_inputs("mlp", 0))
    late = cuda_pool.TorchPool()
    assert model._lib.kiln_model_set_pool_hook(model._handle, late.callback, None) != 0
    assert "before the model's first run" in model._error()


def test_the_probe_says_where_this_threads_allocations_go() -> None:
    import torch

    from kiln.cuda_pool import _routes_to

    pool = torch.cuda.MemPool()
    assert not _routes_to(pool)
    with torch.cuda.use_mem_pool(pool):
        assert _routes_to(pool)
    assert not _routes_to(pool)


def test_a_pool_that_routes_nothing_leaves_torchs_calls_direct(
        builds: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the probe finds the model's pool unused, its BEGIN fails: torch's calls run
    directly, kiln's kernels are replayed, and the thread's routing is undone."""
    from kiln import cuda_pool
    from kiln.loader import load

    monkeypatch.setattr(cuda_pool, "_routes_to", lambda pool: False)
    direct, replayed = load(builds / "convnet", graphs=False), load(builds / "convnet", graphs=True)
    for seed in (0, 1, 2):
        inputs = _inputs("convnet", seed)
        _same(replayed(*inputs), direct(*inputs))
    said = replayed.replay
    assert "pool hook returned a failure at KILN_POOL_BEGIN" in said
    assert "convolution x" in said
    assert "another memory pool" in said  # the hook's own reason, from the loader
    monkeypatch.undo()
    hook = replayed._pool
    assert hook is not None
    assert not cuda_pool._routes_to(hook._pool)  # the failed BEGIN left no routing behind
