"""cond and while_loop end to end on both targets: every kernel of every branch and loop body
is tuned whichever branch the example inputs take, nested and data-dependent loops match eager,
and the control-flow forms kiln does not compile are clear errors."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from contract.config import load_config
from kiln.loader import load
from kiln.run_model import eager_model, flat_tensors, random_inputs
from pipeline.build import Cache, compile_model
from pipeline.runner import BuildOptions, BuildResult
from tests.conftest import kiln, write_config

TARGETS = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cache]:
    cache = Cache.open(tmp_path_factory.mktemp("control") / "cache")
    yield cache
    cache.records.close()


def _compile(name: str, target: str, root: Path, cache: Cache) -> tuple[BuildResult, Path]:
    out = root / f"{name}-{target}"
    return compile_model(load_config(name), BuildOptions(target, out), cache), out


def _device(target: str, values: tuple[Any, ...]) -> tuple[Any, ...]:
    device = "cuda" if target == "cuda" else "cpu"
    return tuple(v.to(device) if isinstance(v, torch.Tensor) else v for v in values)


def _assert_matches(got: object, want: object) -> None:
    for a, b in zip(flat_tensors(got), flat_tensors(want), strict=True):
        torch.testing.assert_close(a.cpu(), b.cpu(), rtol=1e-4, atol=1e-4)


def _autotune_note(result: BuildResult) -> str:
    return next(row.note for row in result.rows if row.stage == "autotune")


@pytest.mark.parametrize("target", TARGETS)
def test_a_branch_the_example_inputs_never_take_is_tuned_and_runs(target: str, tmp_path: Path,
                                                                  shared_cache: Cache) -> None:
    result, out = _compile("cond-rare", target, tmp_path, shared_cache)
    config = load_config("cond-rare")
    model = eager_model(config, out).to("cuda" if target == "cuda" else "cpu")
    examples = [_device(target, random_inputs(config, seed)) for seed in range(4)]
    assert not any(bool(model.predicate(*inputs)) for inputs in examples)

    records = json.loads((out / "timings.json").read_text())
    places = {place: r for r in records.values() for place in r["places"]}
    assert set(places) == {"main", "cond.then", "cond.else"}
    assert places["cond.then"]["timings"]
    assert all(r["tuned"] for r in records.values())
    assert _autotune_note(result).startswith("kernels tuned 3 of 3, of which 2 inside control flow")
    report = json.loads((out / "report.json").read_text())
    assert {p for row in report["kernels"] for p in row["places"]} == set(places)
    if target == "cuda":  # kernels in branches are tuned one at a time too: peak is one kernel's
        for r in records.values():  # slack: the allocator rounds each tensor up to 512 bytes
            assert r["peak_bytes"] <= 1.2 * r["inputs_bytes"] + 8192, r

    compiled = load(out)
    for inputs in examples:
        scales = (1e4, -1e4, 1e6, -1e6)
        taken = next((inputs[0] * s,) for s in scales if bool(model.predicate(inputs[0] * s)))
        _assert_matches(compiled(*taken), model(*taken))
        _assert_matches(compiled(*inputs), model(*inputs))


@pytest.mark.parametrize("target", TARGETS)
def test_nested_and_data_dependent_control_flow_matches_eager(target: str, tmp_path: Path,
                                                              shared_cache: Cache) -> None:
    """nested: a while_loop whose body holds a cond whose else branch holds a while_loop; it
    stops when the state is small or after 6 steps, so the number of steps depends on x."""
    result, out = _compile("nested", target, tmp_path, shared_cache)
    assert "inside control flow" in _autotune_note(result)
    config = load_config("nested")
    compiled, model = load(out), eager_model(config, out).to("cuda" if target == "cuda" else "cpu")
    steps = set()
    for seed in (1, 2):
        (x,) = _device(target, random_inputs(config, seed))
        for scale in (1.0, -10.0, 1e-3):
            want = model(x * scale)
            _assert_matches(compiled(x * scale), want)
            steps.add(int(want[3]))
    assert len(steps) > 1, "every input stopped after the same number of steps"


UNSUPPORTED = {
    "scan": ("from torch._higher_order_ops.scan import scan\n"
             "        _, ys = scan(lambda c, r: (c + r, c * r), x[0] * 0, x)\n"
             "        return ys",
             "torch.scan (torch._higher_order_ops.scan) is not supported by kiln yet"),
    "int-carry": ("loop = torch._higher_order_ops.while_loop\n"
                  "        _, h = loop(lambda n, h: n < 3, lambda n, h: (n + 1, h * 2), (0, x))\n"
                  "        return h",
                  "torch.while_loop carries a int (carried value 0)"),
}

UNSUPPORTED_MODEL = '''
import torch


class Model(torch.nn.Module):
    def forward(self, x):
        {body}


def build(width: int = 16) -> Model:
    return Model()
'''


@pytest.mark.parametrize("construct", sorted(UNSUPPORTED))
def test_unsupported_control_flow_is_a_clear_error(construct: str, project: Path, tmp_path: Path) -> None:
    body, message = UNSUPPORTED[construct]
    (project / "toymodel.py").write_text(UNSUPPORTED_MODEL.format(body=body))
    write_config(project, "toy")
    proc = kiln(["compile", str(project / "configs" / "toy.toml")], tmp_path / "c", check=False)
    assert proc.returncode == 1, proc.stderr
    assert message in " ".join(proc.stderr.split())
    assert "Traceback" not in proc.stderr
