"""The weights stage's entry: trace's manifest (and constants) -> weights.safetensors.

- With a checkpoint: its tensors, checked against the model's state by name, shape and dtype.
  The few tensors no checkpoint holds (non-persistent buffers, tensor attributes) come from an
  item of the seeded init, kept per (model source, config, seed): a new checkpoint of the same
  model builds nothing and imports no model code.
- Without one: the model built for real with weights.seed, as eager builds it.
- An in-memory module (pipeline.compile): its own tensors.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from cache.hashing import canonical_json, digest_bytes
from contract.job import StageJob
from tasks.trace.factory import build_model
from tasks.weights.files import checked_checkpoint, write_weights
from tasks.weights.manifest import CONSTANTS, MANIFEST, attribute, names_from, read_manifest, state_specs
from tasks.weights.spill import Spill

WEIGHTS = "weights.safetensors"
INIT = "init.safetensors"
_INIT_CONFIG = ("model.factory", "model.kwargs", "model.dtype", "weights.seed")


def run(job: StageJob) -> Mapping[str, Any]:
    made = read_manifest(job.input(f"trace/{MANIFEST}"))
    traced = load_file(str(job.input(f"trace/{CONSTANTS}")))
    if job.live is not None:
        write_weights(_from_module(job.live.module, made, traced), job.out_dir / WEIGHTS)
        return {"summary": "from the module"}
    checkpoint = job.config["weights.checkpoint"]
    if checkpoint is None:
        spill = Spill(job.out_dir)
        with spill.building():
            module = build_model(job.config, job.model, Path(job.project_root))
        tensors = _from_module(module, made, traced)
        _, item, _ = _init_item(job, made, lambda: {n: tensors[n] for n in names_from(made, "init")})
        write_weights(tensors, job.out_dir / WEIGHTS, after=spill.release)
        return {"summary": f"seeded init (seed {job.config['weights.seed']})", "items": [item]}
    path = Path(checkpoint)
    state = checked_checkpoint(path, job.model, state_specs(made))
    init: dict[str, torch.Tensor] = {}
    hit, items = True, []
    if names_from(made, "init"):
        init, item, hit = _init_item(job, made, lambda: _seeded_init(job, made))
        items.append(item)
    state = _as_loaded(state, made)
    sources = {"state": state, "init": init, "traced": traced}
    tensors = {name: sources[entry["from"]][name] for name, entry in made["tensors"].items()}
    write_weights(tensors, job.out_dir / WEIGHTS)
    return {"summary": f"checkpoint {path.name}" + ("" if hit else " (and the seeded init's buffers)"),
            "items": items}


# Note: tied weights are one parameter under several names, and load_state_dict copies every
# name's tensor into it in state_dict order, so eager holds the last one's values: every name
# of a tied group gets those here too, whatever the checkpoint holds for the others.
def _as_loaded(state: dict[str, torch.Tensor], made: dict[str, Any]) -> dict[str, torch.Tensor]:
    loaded = dict(state)
    for group in made.get("tied", []):
        for name in group:
            loaded[name] = state[group[-1]]
    return loaded


def _from_module(module: torch.nn.Module, made: dict[str, Any],
                 traced: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The program's tensors, taken from a built module (and trace's constants)."""
    state = module.state_dict(keep_vars=True)
    tensors = {}
    for name, entry in made["tensors"].items():
        source = entry["from"]
        value = state[name] if source == "state" else traced[name] if source == "traced" \
            else attribute(module, name)
        assert isinstance(value, torch.Tensor), f"{name}: not a tensor of the module"
        tensors[name] = value.detach()
    return tensors


def _seeded_init(job: StageJob, made: dict[str, Any]) -> dict[str, torch.Tensor]:
    with Spill(job.out_dir).building():  # the parameters are built only to be dropped
        module = build_model(job.config, job.model, Path(job.project_root))
    return {name: attribute(module, name).detach() for name in names_from(made, "init")}


def _init_item(job: StageJob, made: dict[str, Any],
               make: Any) -> tuple[dict[str, torch.Tensor], str, bool]:
    """The seeded init's tensors that no checkpoint holds, as an item of their own (model
    source, config, seed, manifest), made by `make` on a miss; the item's name (which gc keeps
    with the build) and whether it was a hit."""
    parts = {"sources": digest_bytes(job.input("trace/sources.json").read_bytes()),
             "manifest": digest_bytes(canonical_json(made)),
             "config": digest_bytes(canonical_json({k: job.config[k] for k in _INIT_CONFIG})),
             "code": job.code, "env": digest_bytes(canonical_json(job.env))}

    def compute(folder: Path) -> Mapping[str, Any]:
        tensors = make()
        write_weights(tensors, folder / INIT)  # one buffer shared by two modules: two names
        return {"tensors": len(tensors)}

    entry, hit = job.items().get_or_compute(parts, compute)
    return load_file(str(entry.file(INIT))), f"{entry.stage}/{entry.key}", hit
