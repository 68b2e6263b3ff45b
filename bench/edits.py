"""The edits a recompile benchmark makes: a copy of a model's config with one more layer, or
with a new checkpoint, written as TOML to a folder of its own (the real configs stay as they are).
"""

from __future__ import annotations

import inspect
import json
import math
import re
import tomllib
from pathlib import Path
from typing import Any

from kiln import ModelConfig

# Names that set a model's layer count: our models' (mlp: layers) and transformers' configs
# (BERT: num_hidden_layers, GPT-2: n_layer).
LAYER_KNOBS = ("layers", "num_layers", "n_layers", "depth", "num_hidden_layers", "n_layer", "num_blocks")


def knob_in(values: dict[str, Any]) -> dict[str, Any] | None:
    for name in LAYER_KNOBS:
        value = values.get(name)
        if isinstance(value, int) and not isinstance(value, bool):
            return {"knob": name, "value": value}
    return None


def knob_in_kwargs(config: ModelConfig) -> dict[str, Any] | None:
    """The layer knob set in the config's kwargs; no import needed."""
    return knob_in(config.field("model.kwargs"))


def layer_knob(config: ModelConfig) -> dict[str, Any]:
    """{"knob": NAME, "value": N}: the kwarg of the model's factory that sets its layer count,
    with the value the config builds; {"skipped": why} for a model without one. Looked for in the
    config's kwargs, then the factory's defaults, then (for a factory that passes **kwargs on, as
    the transformers ones do) the `config` of the module it builds."""
    found = knob_in_kwargs(config)
    if found is not None:
        return found
    from kiln.run_model import model_factory, seeded_model

    factory = model_factory(config)
    parameters = inspect.signature(factory).parameters
    defaults = {name: p.default for name, p in parameters.items() if p.default is not inspect.Parameter.empty}
    found = knob_in(defaults)
    if found is not None:
        return found
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        module = seeded_model(config)
        for sub in module.modules():
            settings = getattr(sub, "config", None)
            found = knob_in(vars(settings)) if hasattr(settings, "__dict__") else None
            if found is not None:
                return found
    return {"skipped": f"{config.name} has no layer-count kwarg ({', '.join(LAYER_KNOBS)}) in "
                       f"{config.field('model.factory')}: no one-layer edit to measure"}


def write_config(config: ModelConfig, folder: Path, name: str, *, kwargs: dict[str, Any] | None = None,
                 checkpoint: Path | None = None, seeded: bool = False) -> Path:
    """A copy of config at folder/configs/NAME.toml with new model kwargs, a new checkpoint, or
    (seeded) the seeded weights instead of its checkpoint. The checkpoint path it keeps is made
    absolute, since the copy lives elsewhere, and so is its project: a user's edit of a config
    keeps the config's project, so the copy's trace finds its original's depfile."""
    raw = tomllib.loads(config.path.read_text())
    raw["model"]["project"] = str(config.project_root)  # the copy imports the model as its original does
    if kwargs is not None:
        raw["model"]["kwargs"] = kwargs
    weights = raw.setdefault("weights", {})
    weights.pop("checkpoint", None)
    if checkpoint is not None:
        weights["checkpoint"] = str(checkpoint.resolve())
    elif config.checkpoint is not None and not seeded:
        weights["checkpoint"] = str(config.checkpoint)
    path = folder / "configs" / f"{name}.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dump_toml(raw))
    return path


_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def toml_key(key: str) -> str:
    return key if _BARE_KEY.fullmatch(key) else json.dumps(key)


def toml_value(value: Any) -> str:
    """One TOML value; tables become inline tables. JSON's string escapes are valid in TOML's
    basic strings."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        items = ", ".join(f"{toml_key(k)} = {toml_value(v)}" for k, v in value.items())
        return "{ " + items + " }" if items else "{}"
    raise TypeError(f"no TOML form for {type(value).__name__}")


def is_table_array(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, dict) for v in value)


def dump_toml(raw: dict[str, Any]) -> str:
    """A config document as TOML: top-level values, then [tables], then [[arrays of tables]]."""
    lines = [f"{toml_key(k)} = {toml_value(v)}" for k, v in raw.items()
             if not isinstance(v, dict) and not is_table_array(v)]
    for key, value in raw.items():
        if isinstance(value, dict):
            lines += ["", f"[{toml_key(key)}]", *pairs(value)]
    for key, value in raw.items():
        if is_table_array(value):
            for table in value:
                lines += ["", f"[[{toml_key(key)}]]", *pairs(table)]
    return "\n".join(lines) + "\n"


def pairs(table: dict[str, Any]) -> list[str]:
    return [f"{toml_key(k)} = {toml_value(v)}" for k, v in table.items()]
