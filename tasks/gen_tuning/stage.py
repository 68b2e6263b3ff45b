"""The gen-tuning-code stage's entry: schedule.json -> kernels/, kernels.json and tune.py."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from contract.job import StageJob
from tasks.gen_tuning import cpu
from tasks.schedule import model


def run(job: StageJob) -> Mapping[str, Any]:
    schedule = model.schedule_from(json.loads(job.input("schedule/schedule.json").read_bytes()))
    if job.env["target"] == "cuda":
        from tasks.gen_tuning import cuda  # triton, only for this target

        spec = cuda.write(schedule, job.out_dir)
    else:
        spec = cpu.write(schedule, job.out_dir, job.env["isa"])
    variants = sum(len(k["variants"]) for k in spec["kernels"])
    return {"kernels": len(spec["kernels"]), "variants": variants,
            "summary": f"{len(spec['kernels'])} distinct kernels, {variants} variants"}
