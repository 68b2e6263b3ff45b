"""The CUDA graph replay's bookkeeping (runtime/kiln_replay.cpp), without a GPU: the runtime's
unit built against a fake of its CUDA layer that logs each driver call (tests/replay_fake.cpp).
The GPU tests (tests/test_cuda_replay.py) check the results on a real one."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tasks.codegen.cpp_build import RUNTIME, torch_include

FAKE = Path(__file__).parent / "replay_fake.cpp"


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    exe = tmp_path_factory.mktemp("replay") / "replay_fake"
    subprocess.run(["g++", "-std=c++17", "-O1", f"-I{RUNTIME}", f"-I{torch_include()}", str(FAKE),
                    str(RUNTIME / "kiln_replay.cpp"), "-o", str(exe)], check=True, capture_output=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True, timeout=60).stdout
    found: dict[str, list[str]] = {}
    for block in out.split("END\n"):
        lines = block.strip().splitlines()
        if lines:
            found[lines[0].removeprefix("SCENARIO ")] = lines[1:]
    return found


CALLS = ["ran k0", "ran k1", "ran attention", "ran k2", "ran mm"]


def test_the_first_run_runs_directly_on_its_own_stream_then_records_each_segment(
        logs: dict[str, list[str]]) -> None:
    assert logs["record"] == [
        "wait own on caller", *CALLS,
        "begin capture on own", "ran k0", "ran k1", "end capture", "graph 0 on own",
        "ran attention",
        "begin capture on own", "ran k2", "end capture", "graph 1 on own",
        "ran mm", "wait caller on own",
        "on: 2 CUDA graphs of 3 calls; inputs and outputs copied to and from the model's own buffers; "
        "run directly (no pool hook for torch's allocations): attention x1, mm x1"]


def test_a_replay_launches_each_graph_and_runs_only_the_direct_calls(logs: dict[str, list[str]]) -> None:
    assert logs["replay"][:4] == ["graph 0 on caller", "ran attention", "graph 1 on caller", "ran mm"]
    differ = "error: the model's GPU calls differ from those its CUDA graphs hold (at a predicate)"
    assert logs["other calls"][:2] == ["graph 0 on caller", differ]


def test_a_failed_capture_turns_replay_off_and_the_run_goes_on_directly(logs: dict[str, list[str]]) -> None:
    assert logs["refused"] == [
        "wait own on caller", *CALLS, "abandon capture", "drop graphs", "wait caller on own", *CALLS,
        "off: a capture failed (capture refused); the model runs its calls directly"]
    assert logs["after refused"] == [*CALLS, logs["refused"][-1]]


def test_a_direct_call_that_fails_while_recording_fails_the_run_only(logs: dict[str, list[str]]) -> None:
    failed = logs["direct fails"]
    assert failed[-4:] == ["drop graphs", "wait caller on own", "error: attention failed",
                           "on: the first run records its CUDA graphs"]
    assert logs["records again"][-1].startswith("on: 2 CUDA graphs")


def test_a_model_with_nothing_to_capture_turns_replay_off_after_its_first_run(
        logs: dict[str, list[str]]) -> None:
    calls = ["ran mm", "ran attention"]
    assert logs["nothing"] == [
        "wait own on caller", *calls, *calls, "wait caller on own", *calls,
        "off: nothing to capture: every GPU call of the model runs directly"]


def test_replay_turned_off_runs_every_call(logs: dict[str, list[str]]) -> None:
    assert logs["off"] == [*CALLS, "off: KILN_CREATE_NO_GRAPHS"]


POOLED_CALLS = ["ran k0", "ran mm", "ran a predicate", "ran conv"]


def test_with_a_pool_hook_calls_into_torch_are_captured_between_its_begin_and_end(
        logs: dict[str, list[str]]) -> None:
    assert logs["pooled record"] == [
        "wait own on caller", "pool BEGIN of m", *POOLED_CALLS,
        "begin capture on own", "ran k0", "ran mm", "end capture", "graph 0 on own",
        "ran a predicate",
        "begin capture on own", "ran conv", "end capture", "graph 1 on own",
        "pool END of m", "wait caller on own",
        "on: 2 CUDA graphs of 3 calls; inputs and outputs copied to and from the model's own buffers; "
        "calls into torch captured, their memory in the model's pool; "
        "run directly (fallback ops, reads on the host): a predicate x1"]
    assert logs["pooled replay"][:3] == ["graph 0 on caller", "ran a predicate", "graph 1 on caller"]
    assert logs["pooled destroyed"] == ["pool RELEASE of m"]


def test_a_pool_hook_that_fails_costs_the_torch_calls_or_replay_and_its_pool_is_still_released(
        logs: dict[str, list[str]]) -> None:
    assert logs["hook fails at begin"] == [
        "wait own on caller", "pool BEGIN of m", *POOLED_CALLS,
        "begin capture on own", "ran k0", "end capture", "graph 0 on own",
        "ran mm", "ran a predicate", "ran conv", "wait caller on own", "pool RELEASE of m",
        "on: 1 CUDA graph of 1 calls; inputs and outputs copied to and from the model's own buffers; "
        "run directly (the pool hook returned a failure at KILN_POOL_BEGIN): "
        "a predicate x1, conv x1, mm x1"]
    assert logs["hook fails at end"][-10:] == [
        "pool END of m", "abandon capture", "drop graphs", "wait caller on own", *POOLED_CALLS,
        "pool RELEASE of m",
        "off: a capture failed (the pool hook returned a failure at KILN_POOL_END); "
        "the model runs its calls directly"]


def test_a_recording_after_a_failed_one_asks_the_pool_hook_again(logs: dict[str, list[str]]) -> None:
    """BEGIN fails, then the run's own direct call fails: the next run records anew, BEGIN works,
    torch's calls are captured, and the pool is released once."""
    again = logs["pooled again"]
    assert again[:5] == ["wait own on caller", "pool BEGIN of m", "ran k0", "wait caller on own",
                         "error: mm failed"]
    assert again.count("pool BEGIN of m") == 2
    assert again.count("pool END of m") == 1
    assert again.count("pool RELEASE of m") == 1
    assert again[-1].endswith("calls into torch captured, their memory in the model's pool")


def test_kiln_cuda_graphs_names_how_a_cuda_model_replays(monkeypatch: pytest.MonkeyPatch) -> None:
    from kiln.loader import graphs_mode

    monkeypatch.delenv("KILN_CUDA_GRAPHS", raising=False)
    assert graphs_mode(None) == "all"
    for said, mode in (("0", "off"), ("off", "off"), (" Kernels ", "kernels"), ("1", "all")):
        monkeypatch.setenv("KILN_CUDA_GRAPHS", said)
        assert graphs_mode(None) == mode
    assert graphs_mode(False) == "off"  # the argument wins over the variable
    assert graphs_mode(True) == "all"
