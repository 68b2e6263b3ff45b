"""Build the model a config describes: import its factory, seed, construct, load weights."""

from __future__ import annotations

import importlib
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from contract.config import KILN_PACKAGES
from contract.errors import KilnError, MissingPackage

# Import names whose pip package is called something else.
_PIP_NAMES = {"sklearn": "scikit-learn", "PIL": "pillow", "yaml": "pyyaml", "cv2": "opencv-python"}

DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
    "int64": torch.int64,
    "int32": torch.int32,
    "int16": torch.int16,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "bool": torch.bool,
}


def import_factory(spec: str, model: str) -> Callable[..., Any]:
    module_name, attr = spec.split(":")
    try:
        module = importlib.import_module(module_name)  # codedeps: the model's code (trace's depfile)
    except ModuleNotFoundError as err:
        missing = (err.name or module_name).split(".")[0]
        if module_name == err.name or module_name.startswith(f"{err.name}."):
            raise KilnError(
                f"model {model!r}: factory module {module_name!r} was not found",
                "check model.factory in the config (module:callable, importable from the "
                "project root)",
            ) from err
        raise MissingPackage(_PIP_NAMES.get(missing, missing), model) from err
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise KilnError(f"model {model!r}: {module_name} has no callable {attr!r}",
                        "check model.factory in the config")
    return factory  # type: ignore[no-any-return]


def build_model(config: dict[str, Any], model: str, project_root: Path) -> torch.nn.Module:
    factory = import_factory(config["model.factory"], model)
    torch.manual_seed(config["weights.seed"])
    try:
        module = factory(**config["model.kwargs"])
    except KilnError:
        raise
    except ModuleNotFoundError as err:
        missing = (err.name or "?").split(".")[0]
        raise MissingPackage(_PIP_NAMES.get(missing, missing), model) from err
    except Exception as err:
        where = user_frame(err, project_root)
        raise KilnError(
            f"model {model!r}: factory {config['model.factory']} failed: "
            f"{type(err).__name__}: {err}{where}",
            "check model.kwargs in the config",
        ) from err
    if not isinstance(module, torch.nn.Module):
        raise KilnError(f"model {model!r}: factory returned {type(module).__name__}, "
                        "not a torch.nn.Module")
    return module.eval().to(DTYPES[config["model.dtype"]])


def user_frame(err: BaseException, project_root: Path) -> str:
    """' at FILE:LINE: CODE' for the innermost frame in the model's own code, or ''."""
    frames = traceback.extract_tb(err.__traceback__)
    for frame in reversed(frames):
        if is_model_file(frame.filename, project_root):
            rel = _rel(frame.filename, project_root)
            return f"\n  at {rel}:{frame.lineno}: {(frame.line or '').strip()}"
    return ""


def is_model_file(filename: str, project_root: Path) -> bool:
    """Model code: the project's files and packages such as transformers, but not torch,
    the standard library or kiln itself."""
    path = Path(filename)
    skip = ("torch", "functorch", *KILN_PACKAGES, "importlib", "contextlib")
    parts = path.parts
    if any(p in ("site-packages", "dist-packages") for p in parts):
        idx = max(i for i, p in enumerate(parts) if p in ("site-packages", "dist-packages"))
        return len(parts) > idx + 1 and parts[idx + 1] not in skip
    if not path.is_relative_to(project_root):
        return False
    rel = path.relative_to(project_root).parts
    return bool(rel) and rel[0] not in skip


def _rel(filename: str, root: Path) -> str:
    return shown_path(filename, root)


def shown_path(filename: str, root: Path) -> str:
    """How a model file is named in messages and artifacts, the same on every machine: a
    package's file from its package folder on ("transformers/models/bert/modeling_bert.py"),
    wherever the environment is; a project file from the project root on.

    Note: an absolute path (or one relative to wherever the venv happens to sit) would make
    trace's source_map.json differ between machines and checkouts for the same model."""
    path = Path(filename)
    sites = [i for i, p in enumerate(path.parts) if p in ("site-packages", "dist-packages")]
    if sites:
        return Path(*path.parts[sites[-1] + 1:]).as_posix()
    return path.relative_to(root).as_posix() if path.is_relative_to(root) else filename


def example_inputs(specs: list[dict[str, Any]], seed: int) -> tuple[torch.Tensor, ...]:
    """Deterministic example inputs: normal floats, integers uniform in their range."""
    gen = torch.Generator().manual_seed(seed)
    tensors = []
    for spec in specs:
        dtype = DTYPES[spec["dtype"]]
        shape = tuple(spec["shape"])
        if dtype.is_floating_point:
            tensors.append(torch.randn(shape, generator=gen).to(dtype))
        elif dtype == torch.bool:
            tensors.append(torch.randint(0, 2, shape, generator=gen).bool())
        else:
            low, high = spec["range"]
            tensors.append(torch.randint(low, high, shape, generator=gen, dtype=dtype))
    return tuple(tensors)
