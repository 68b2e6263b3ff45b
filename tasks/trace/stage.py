"""The trace stage's entry: config -> program.json, weights.safetensors, source_map.json."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cache.hashing import pretty_json
from contract.job import StageJob
from tasks.trace import deps
from tasks.trace.export import decompose, export_only, program_json, source_map, weight_tensors
from tasks.trace.factory import build_model, example_inputs
from tasks.trace.weights import WeightsWriter, load_checkpoint

PROGRAM = "program.json"
WEIGHTS = "weights.safetensors"
SOURCE_MAP = "source_map.json"


def run(job: StageJob) -> Mapping[str, Any]:
    root = Path(job.project_root)
    imported_before = set(sys.modules)
    if job.live is not None:
        module, args = job.live.module, job.live.args
    else:
        module = build_model(job.config, job.model, root)
        checkpoint = job.config["weights.checkpoint"]
        if checkpoint is not None:
            load_checkpoint(module, Path(checkpoint), job.model)
        args = example_inputs(job.config["inputs"], job.config["weights.seed"])
    exported = export_only(module, args, job.model, root, job.warnings.append)
    out = job.out_dir
    with WeightsWriter(weight_tensors(exported), out / WEIGHTS) as weights:
        program = decompose(exported, job.model, root)
        (out / PROGRAM).write_bytes(program_json(program))
        (out / SOURCE_MAP).write_text(pretty_json(source_map(program, root)))
        weights.expect(weight_tensors(program))
    notes: dict[str, Any] = {"nodes": len(program.graph.nodes)}
    if job.live is None:
        notes["depfile"] = deps.collect(root, imported_before)
    return notes

