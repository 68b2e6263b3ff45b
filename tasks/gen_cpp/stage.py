"""The gen-cpp stage: schedule.json (+ tuning decisions) -> wrapper.cpp and model.json. Its entry
is the target's (tasks/targets/*/launch.py), which supplies how a kernel is launched."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from cache.hashing import pretty_json
from contract.errors import KilnError
from contract.job import StageJob
from contract.model_json import ModelJson, TensorSpec
from tasks.gen_cpp.wrapper import Launcher, WrapperError, wrapper_source
from tasks.ir.nodes import Buffer, BufferKind
from tasks.schedule.model import Schedule, schedule_from

WRAPPER = "wrapper.cpp"
MODEL_JSON = "model.json"  # inputs, outputs and output structure, for loaders and people


def run_with(job: StageJob, launcher_for: Callable[[Mapping[str, Any]], Launcher]) -> Mapping[str, Any]:
    """The stage, with the target's launcher (made from autotune's decisions): each target's
    gen-cpp entry (tasks/targets/*/launch.py) calls this."""
    schedule = schedule_from(json.loads(job.input("schedule/schedule.json").read_text()))
    tuning = json.loads(job.input("autotune/tuning.json").read_text())
    missing = sorted({k.key for k in schedule.kernels} - set(tuning))
    if missing:
        raise KilnError(f"model {job.model!r}: no tuning decision for kernel {missing[0][:16]}",
                        "autotune's output does not match the schedule; recompile with --force autotune")
    signature = json.loads(job.input("lower/signature.json").read_text())
    try:
        source = wrapper_source(schedule, launcher_for(tuning), job.env["isa"])
    except WrapperError as err:
        raise KilnError(f"model {job.model!r}: {err}") from None
    (job.out_dir / WRAPPER).write_text(source)
    (job.out_dir / MODEL_JSON).write_text(pretty_json(model_json(schedule, signature, job.target).to_json()))
    lines = source.count("\n")
    return {"lines": lines, "summary": f"{lines} lines of C++"}


def _io(b: Buffer, name: str) -> TensorSpec:
    return TensorSpec(name, b.shape, b.stride, b.dtype.value)


def model_json(schedule: Schedule, signature: Mapping[str, Any], target: str) -> ModelJson:
    main = schedule.main
    produced = {b.name: b for b in main.buffers}
    inputs = tuple(_io(b, b.name) for b in main.inputs if b.kind is not BufferKind.WEIGHT)
    outputs = tuple(_io(produced[name], f"output{i}") for i, name in enumerate(main.user_outputs()))
    return ModelJson(target, inputs, outputs, signature.get("in_spec"), signature.get("out_spec"))
