"""Model configs: one TOML file per model in configs/, validated into plain data.

A config names a factory (`module:callable` plus kwargs), the example inputs (shape, dtype,
and a value range for integer inputs), the model's dtype and device, and its weights (seeded
random init or a checkpoint file). Stages read it only through dotted field names they
declare in the stage table, e.g. `model.factory`, so a key depends on exactly those fields.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from pathlib import Path
from typing import Any

from contract.errors import KilnError
from contract.executor_settings import from_table

PROJECT_ROOT = Path(__file__).resolve().parent.parent
# kiln's own top-level packages: never model code, never in a trace's depfile
KILN_PACKAGES = ("cache", "contract", "tasks", "pipeline", "kiln", "cli", "bench", "scripts")

FLOAT_DTYPES = ("float32", "float16", "bfloat16", "float64")
INT_DTYPES = ("int64", "int32", "int16", "int8", "uint8")
DTYPES = (*FLOAT_DTYPES, *INT_DTYPES, "bool")
DEVICES = ("auto", "cpu", "cuda")
_SECTIONS = {"description", "model", "inputs", "weights", "executor", "tuning", "lower"}
_MODEL_KEYS = {"factory", "kwargs", "dtype", "device", "requires", "project"}
_INPUT_KEYS = {"name", "shape", "dtype", "range"}
_WEIGHT_KEYS = {"seed", "checkpoint"}
_TUNING_KEYS = {"matmul"}
_LOWER_KEYS = {"layout"}
# Note: where a matmul's product goes only to the pointwise kernel after it (a bias, a GELU, a
# residual add), the cuda target may run the two as one Triton kernel (tasks/codegen/
# triton_matmul.py). "auto" times that template against the library call and the kernel, on
# the GPU, and ships the faster (the library call where there is no GPU to time on);
# "template" always ships the template; "library" never tries it. The cpu target has no template.
# "library" is the default until the templates have run on a GPU (make test-gpu's
# tests/test_cuda_matmul.py, and bench/cuda_replay.py --matmul library,auto): a build that has
# not asked for them runs only what the GPU tests have checked.
MATMUL_CHOICES = ("auto", "template", "library")
MATMUL_DEFAULT = "library"
# Note: "auto" lays a half-precision 2-d convolution's weight, its output and the kernels that
# follow it out channels-last on the cuda target (tasks/lower/layout.py), as cuDNN's tensor-core
# kernels take them; "traced" keeps the layouts torch.export recorded (row-major, or the
# model's own). The cpu target is "traced" either way. "traced" is the default until "auto" has
# run on a GPU (make test-gpu's tests/test_cuda_end_to_end.py runs both), as for the matmul
# templates above.
LAYOUT_CHOICES = ("auto", "traced")
LAYOUT_DEFAULT = "traced"


@dataclass(frozen=True, slots=True)
class ModelConfig:
    name: str
    path: Path
    project_root: Path
    fields: dict[str, Any]
    # Note: the [executor] table says where per-kernel work runs, not what it makes, so it is
    # kept apart from the fields stages declare; only its gpu and arch reach a key, as the
    # tuning GPU's env facts (contract/executor_settings.py's tuning_gpu).
    executor: dict[str, str] = dataclass_field(default_factory=dict)

    def field(self, dotted: str) -> Any:
        return self.fields.get(dotted)

    def job_value(self, dotted: str) -> Any:
        """A field as a stage sees it: paths resolved against the config file's folder."""
        if dotted == "weights.checkpoint":
            return None if self.checkpoint is None else str(self.checkpoint)
        return self.fields.get(dotted)

    @property
    def checkpoint(self) -> Path | None:
        raw = self.fields["weights.checkpoint"]
        return None if raw is None else (self.path.parent / raw).resolve()


def config_dirs() -> list[Path]:
    extra = os.environ.get("KILN_CONFIGS")
    dirs = [Path(extra)] if extra else []
    return [*dirs, Path.cwd() / "configs", PROJECT_ROOT / "configs"]


def find_config(model: str) -> Path:
    if model.endswith(".toml") or os.sep in model:
        path = Path(model)
        if not path.is_file():
            raise KilnError(f"config file {model} does not exist")
        return path.resolve()
    for folder in config_dirs():
        candidate = folder / f"{model}.toml"
        if candidate.is_file():
            return candidate.resolve()
    known = sorted({p.stem for d in config_dirs() if d.is_dir() for p in d.glob("*.toml")})
    raise KilnError(
        f"unknown model {model!r}",
        f"pick one of: {', '.join(known)}; or pass the path of a .toml config",
    )


def load_config(model: str) -> ModelConfig:
    path = find_config(model)
    try:
        raw = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as err:
        raise KilnError(f"{path.name} is not valid TOML: {err}", "fix the file's syntax") from err
    except OSError as err:
        raise KilnError(f"cannot read {path}: {err.strerror}") from err
    fields = _validate(raw, path.name)
    project = raw["model"].get("project")
    if project is not None:
        if not isinstance(project, str) or not (path.parent / project).is_dir():
            raise _bad(path.name, f"model.project must name a folder (relative to the config), "
                                  f"got {project!r}")
        root = (path.parent / project).resolve()
    else:
        root = path.parent.parent if path.parent.name == "configs" else path.parent
    executor = from_table(_table(raw, "executor", path.name, required=False), path.name)
    return ModelConfig(path.stem, path, root, fields, executor)


def _validate(raw: dict[str, Any], where: str) -> dict[str, Any]:
    _no_unknown(raw, _SECTIONS, where)
    model = _table(raw, "model", where, required=True)
    _no_unknown(model, _MODEL_KEYS, f"{where} [model]")
    weights = _table(raw, "weights", where, required=False)
    _no_unknown(weights, _WEIGHT_KEYS, f"{where} [weights]")
    tuning = _table(raw, "tuning", where, required=False)
    _no_unknown(tuning, _TUNING_KEYS, f"{where} [tuning]")
    lower = _table(raw, "lower", where, required=False)
    _no_unknown(lower, _LOWER_KEYS, f"{where} [lower]")
    return {
        "model.factory": _factory(model.get("factory"), where),
        "model.kwargs": _kwargs(model.get("kwargs", {}), where),
        "model.dtype": _choice(model.get("dtype", "float32"), FLOAT_DTYPES, "model.dtype", where),
        "model.device": _choice(model.get("device", "auto"), DEVICES, "model.device", where),
        "model.requires": _str_list(model.get("requires", []), "model.requires", where),
        "inputs": _inputs(raw.get("inputs"), where),
        "weights.seed": _int(weights.get("seed", 0), "weights.seed", where),
        "weights.checkpoint": _opt_str(weights.get("checkpoint"), "weights.checkpoint", where),
        "tuning.matmul": _choice(tuning.get("matmul", MATMUL_DEFAULT), MATMUL_CHOICES, "tuning.matmul",
                                 where),
        "lower.layout": _choice(lower.get("layout", LAYOUT_DEFAULT), LAYOUT_CHOICES, "lower.layout", where),
    }


def _bad(where: str, what: str) -> KilnError:
    return KilnError(f"{where}: {what}", "see configs/mlp.toml for a complete example")


def _no_unknown(table: dict[str, Any], known: set[str], where: str) -> None:
    unknown = sorted(set(table) - known)
    if unknown:
        raise _bad(where, f"unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")


def _table(raw: dict[str, Any], name: str, where: str, *, required: bool) -> dict[str, Any]:
    value = raw.get(name)
    if value is None and not required:
        return {}
    if not isinstance(value, dict):
        raise _bad(where, f"needs a [{name}] table")
    return value


def _factory(value: Any, where: str) -> str:
    if not isinstance(value, str) or value.count(":") != 1 or not all(value.split(":")):
        raise _bad(where, f"model.factory must be 'module:callable', got {value!r}")
    return value


def _kwargs(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _bad(where, "model.kwargs must be a table")
    return value


def _choice(value: Any, allowed: tuple[str, ...], name: str, where: str) -> str:
    if value not in allowed:
        raise _bad(where, f"{name} must be one of {', '.join(allowed)}, got {value!r}")
    return str(value)


def _int(value: Any, name: str, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise _bad(where, f"{name} must be an integer, got {value!r}")
    return value


def _opt_str(value: Any, name: str, where: str) -> str | None:
    if value is not None and not isinstance(value, str):
        raise _bad(where, f"{name} must be a string, got {value!r}")
    return value


def _str_list(value: Any, name: str, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _bad(where, f"{name} must be a list of strings")
    return list(value)


def _inputs(value: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not value:
        raise _bad(where, "needs at least one [[inputs]] table")
    specs = []
    for i, spec in enumerate(value):
        at = f"{where} [[inputs]] #{i + 1}"
        if not isinstance(spec, dict):
            raise _bad(at, "must be a table")
        _no_unknown(spec, _INPUT_KEYS, at)
        specs.append(_input(spec, at))
    names = [s["name"] for s in specs]
    if len(set(names)) != len(names):
        raise _bad(where, f"input names must be unique, got {names}")
    return specs


def _input(spec: dict[str, Any], at: str) -> dict[str, Any]:
    name = spec.get("name")
    if not isinstance(name, str) or not name.isidentifier():
        raise _bad(at, f"name must be an identifier, got {name!r}")
    shape = spec.get("shape")
    if not isinstance(shape, list) or not all(isinstance(d, int) and d > 0 for d in shape):
        raise _bad(at, f"shape must be a list of positive integers, got {shape!r}")
    dtype = _choice(spec.get("dtype", "float32"), DTYPES, "dtype", at)
    out: dict[str, Any] = {"name": name, "shape": shape, "dtype": dtype}
    if dtype in INT_DTYPES:
        bounds = spec.get("range")
        ok = isinstance(bounds, list) and len(bounds) == 2 and all(isinstance(b, int) for b in bounds)
        if not ok or not isinstance(bounds, list) or bounds[0] >= bounds[1]:
            raise _bad(at, f"integer input {name!r} needs range = [low, high) with low < high")
        out["range"] = bounds
    elif "range" in spec:
        raise _bad(at, f"range is only for integer inputs, and {name!r} is {dtype}")
    return out
