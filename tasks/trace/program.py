"""Reading program.json back into a torch ExportedProgram, with weights as meta tensors.

Later stages need the graph, shapes and dtypes, never weight values; building the program on
the meta device keeps the weights off every device during the compile.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import torch
from torch._export.serde.serialize import (
    _SERIALIZE_TO_TORCH_DTYPE,
    SerializedArtifact,
    deserialize,
)


def load_program(path: Path) -> torch.export.ExportedProgram:
    data = json.loads(path.read_text())
    state, constants = _meta_state(data)
    artifact = SerializedArtifact(
        path.read_bytes(), _save(state), _save(constants), _save(())
    )
    return deserialize(artifact)


def _save(value: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(value, buf)
    return buf.getvalue()


def _meta_state(data: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    values = data["graph_module"]["graph"]["tensor_values"]
    state: dict[str, Any] = {}
    constants: dict[str, Any] = {}
    for spec in data["graph_module"]["signature"]["input_specs"]:
        kind, body = next(iter(spec.items()))
        if kind == "parameter":
            meta = _meta(values[body["arg"]["name"]])
            state[body["parameter_name"]] = torch.nn.Parameter(meta, requires_grad=False)
        elif kind == "buffer":
            target = state if body.get("persistent") else constants
            target[body["buffer_name"]] = _meta(values[body["arg"]["name"]])
        elif kind == "tensor_constant":
            constants[body["tensor_constant_name"]] = _meta(values[body["arg"]["name"]])
    return state, constants


def _meta(value: dict[str, Any]) -> torch.Tensor:
    sizes = [s["as_int"] for s in value["sizes"]]
    strides = [s["as_int"] for s in value["strides"]]
    dtype = _SERIALIZE_TO_TORCH_DTYPE[value["dtype"]]
    return torch.empty_strided(sizes, strides, dtype=dtype, device="meta")
