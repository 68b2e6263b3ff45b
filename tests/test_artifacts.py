"""Typed artifacts between stages and the build folder: the JSON round-trips to the same bytes,
and anything else is refused with what is wrong."""

from __future__ import annotations

import json

import pytest

from cache.hashing import pretty_json
from contract.model_json import FileRecord, ModelJson, TensorSpec
from tasks.targets.cpu.decisions import CpuDecision
from tasks.targets.cpu.decisions import tuning_json as cpu_tuning_json
from tasks.targets.cuda.decisions import read_tuning
from tasks.targets.cuda.decisions import tuning_json as cuda_tuning_json

_FILES = {"model.so": FileRecord(10, "ab" * 32), "weights.safetensors": FileRecord(4, "cd" * 32, "e" * 32)}
_MODEL = ModelJson("cpu", (TensorSpec("x", (2, 3), (3, 1), "f32"),),
                   (TensorSpec("output0", (2,), (1,), "f32"),), None, '[1, {"type": null}]', _FILES)


@pytest.mark.parametrize("model", [_MODEL, ModelJson("cuda", (), (), None, None)])
def test_model_json_round_trips_to_the_same_bytes(model: ModelJson) -> None:
    text = pretty_json(model.to_json())
    assert ModelJson.from_json(json.loads(text)) == model
    assert pretty_json(ModelJson.from_json(json.loads(text)).to_json()) == text


@pytest.mark.parametrize(("change", "problem"), [
    (lambda d: d.pop("target"), "'target' must be a string"),
    (lambda d: d.update(inputs={}), "'inputs' must be a list"),
    (lambda d: d["outputs"][0].update(shape=[2.5]), "'shape' must be a list of integers"),
    (lambda d: d["files"]["model.so"].update(bytes="10"), "integer bytes"),
    (lambda d: d.update(files=[]), "a files section must be a JSON object"),
])
def test_model_json_refuses_what_kiln_never_writes(change: object, problem: str) -> None:
    data = _MODEL.to_json()
    change(data)  # type: ignore[operator]
    with pytest.raises(ValueError, match=problem):
        ModelJson.from_json(data)


def test_tuning_decisions_round_trip_to_the_same_bytes() -> None:
    cuda = {"k1": {"variant": "persistent", "function": "k1_persistent", "tuned": True, "cubin": "ab" * 32,
                   "config": {"XBLOCK": 32, "RBLOCK": 16, "num_warps": 4, "num_stages": 1},
                   "launch": {"name": "k1_persistent", "num_warps": 4, "shared": 0, "folded": ["rnumel"],
                              "global_scratch_size": 0, "profile_scratch_size": 0}}}
    assert cuda_tuning_json(read_tuning(cuda)) == cuda
    cpu = {"k1": {"variant": "par1_simd", "config": {"parallel": 1, "simd": True, "split_r": False},
                  "object": "cd" * 32}}
    assert cpu_tuning_json({k: CpuDecision.from_json(d) for k, d in cpu.items()}) == cpu
