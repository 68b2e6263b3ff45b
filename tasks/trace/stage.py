"""The trace stage's entry: config -> program.json, source_map.json, and for the weights stage
the weights' manifest (weights.json, with constants.safetensors for the constants only the
export knows) and the digests of the model's sources (sources.json).

The module is built without weights (tasks/trace/fake.py): no init, no checkpoint, no memory;
the weights stage makes the weights file. A model that cannot be built so is built for real.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from cache.hashing import canonical_json, pretty_json
from contract.errors import KilnError
from contract.job import StageJob
from contract.libraries import shared_while
from tasks.trace import deps
from tasks.trace.export import decompose, export_only, program_json, source_map, weight_tensors
from tasks.trace.factory import build_model, example_inputs, import_factory
from tasks.trace.fake import build_fake, fake_inputs
from tasks.weights.files import write_weights
from tasks.weights.manifest import CONSTANTS, MANIFEST, manifest, traced_constants, write_manifest

PROGRAM = "program.json"
SOURCE_MAP = "source_map.json"
SOURCES = "sources.json"


def run(job: StageJob) -> Mapping[str, Any]:
    root = Path(job.project_root)
    seconds: dict[str, float] = {}
    notes: dict[str, Any] = {}
    if job.live is not None:
        module, args = job.live.module, job.live.args
        exported = _timed(seconds, "export", lambda: export_only(module, args, job.model, root,
                                                                    job.warnings.append))
    else:
        module, exported = _export_config_model(job, root, seconds, notes)
    program = _timed(seconds, "decompositions", lambda: decompose(exported, job.model, root))
    start = time.perf_counter()
    out = job.out_dir
    (out / PROGRAM).write_bytes(program_json(program))
    (out / SOURCE_MAP).write_text(pretty_json(source_map(program, root)))
    tensors = weight_tensors(program)
    made = manifest(tensors, module)
    write_manifest(made, out / MANIFEST)
    write_weights(traced_constants(tensors, made), out / CONSTANTS)
    seconds["serialization"] = time.perf_counter() - start
    notes |= {"nodes": len(program.graph.nodes), "seconds": {k: round(v, 3) for k, v in seconds.items()}}
    sources: dict[str, Any] = {}
    if job.live is None:
        notes["depfile"] = deps.collect(root, job.config["model.factory"].partition(":")[0])
        # what the weights stage's init runs: the model's files (by content, never by path)
        depfile = notes["depfile"]
        sources = {"files": sorted(depfile["files"].values()), "packages": depfile["packages"]}
    (out / SOURCES).write_bytes(canonical_json(sources))
    return notes


def _timed(seconds: dict[str, float], what: str, work: Callable[[], Any]) -> Any:
    start = time.perf_counter()
    try:
        return work()
    finally:
        seconds[what] = seconds.get(what, 0.0) + time.perf_counter() - start


def _export_config_model(job: StageJob, root: Path, seconds: dict[str, float],
                         notes: dict[str, Any]) -> tuple[torch.nn.Module, torch.export.ExportedProgram]:
    """The config's module exported without its weights; built for real where it must be."""
    args = example_inputs(job.config["inputs"], 0)
    warned = len(job.warnings)
    try:
        with shared_while(job.libraries_file):
            _timed(seconds, "model imports", lambda: import_factory(job.config["model.factory"], job.model))
            module, mode = _timed(seconds, "construction", lambda: build_fake(job.config, job.model, root))
        exported = _timed(seconds, "export", lambda: export_only(module, fake_inputs(mode, args), job.model,
                                                                 root, job.warnings.append))
        return module, exported
    except Exception as err:  # built for real below: the real build's error is the one to show
        notes["built"] = f"for real (without weights it failed: {_gist(err)})"
        del job.warnings[warned:]
    real = _timed(seconds, "construction", lambda: build_model(job.config, job.model, root))
    exported = _timed(seconds, "export",
                      lambda: export_only(real, args, job.model, root, job.warnings.append))
    return real, exported


def _gist(err: BaseException) -> str:
    text = str(err.args[0]) if isinstance(err, KilnError) and err.args else str(err)
    first = text.strip().splitlines()[0] if text.strip() else type(err).__name__
    return first[:160]
