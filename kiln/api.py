"""The Python surface: `compile(model, example_inputs)` on in-memory modules,
`compile_config(config)` on a model config (what `kiln compile MODEL` runs), and `load(build_dir)`.

`compile` runs the stages exactly as `kiln compile` does (same cache) and loads the result;
for a target whose back half is not built yet it returns the Build, whose report says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contract.config import LAYOUT_DEFAULT, MATMUL_DEFAULT, PROJECT_ROOT, ModelConfig
from contract.errors import KilnError
from contract.facts import TARGETS, default_target
from pipeline.build import Cache, compile_model, default_cache_root
from pipeline.report import report_json
from pipeline.runner import BuildOptions

MODEL_SO = "model.so"


@dataclass(frozen=True)
class Build:
    out: Path
    report: dict[str, Any]

    @property
    def complete(self) -> bool:
        return (self.out / MODEL_SO).is_file()


def compile(
    model: Any,
    example_inputs: tuple[Any, ...],
    *,
    target: str | None = None,
    out: Path | str | None = None,
    cache_dir: Path | str | None = None,
    **config: Any,
) -> Any:
    """Compile an in-memory torch.nn.Module; returns the loaded model once link exists,
    else the Build (its report says which stages ran and which are not built yet)."""
    from tasks.trace.live import LiveModel

    target = _checked_target(target)
    name = type(model).__name__.lower()
    out_dir = Path(out) if out else Path.cwd() / "build" / name
    cfg = _live_config(name, example_inputs, config, _source_root(model))
    # Note: the module is compiled in the mode it is in, and left so: kiln does not call eval()
    # for the user (trace warns about training mode; dropout there is refused with a hint).
    options = BuildOptions(target, out_dir, live=LiveModel(model, tuple(example_inputs)))
    root = Path(cache_dir) if cache_dir else default_cache_root()
    result = compile_model(cfg, options, Cache.open(root))
    build = Build(result.out, report_json(result))
    from kiln.loader import load

    return load(result.out) if build.complete else build


def _check_inputs(inputs: tuple[Any, ...]) -> None:
    """The example inputs are tensors, each an input of the compiled model's."""
    import torch

    if not isinstance(inputs, tuple | list):
        raise KilnError(f"example_inputs is a {type(inputs).__name__}, not a tuple of tensors",
                        "pass the forward's positional inputs as a tuple: compile(model, (x,))")
    for i, value in enumerate(inputs):
        if not isinstance(value, torch.Tensor):
            raise KilnError(f"example input {i} is {type(value).__name__}, not a tensor: kiln compiles a "
                            "forward of tensor inputs",
                            "wrap the model in a module whose forward takes the tensors alone and passes "
                            "the rest itself (by keyword: model(ids, attention_mask=mask))")


def _source_root(model: Any) -> Path:
    """The folder of the file that defines the module's class, where that is the user's code:
    trace names source lines (in errors and its source map) relative to it. Classes from
    installed packages (torchvision, transformers) are named from their package anyway.

    Note: the project root would hide every line of a user's model outside kiln's checkout."""
    import inspect

    try:
        source = inspect.getsourcefile(type(model))
    except TypeError:
        return PROJECT_ROOT
    if source is None or any(p in ("site-packages", "dist-packages") for p in Path(source).parts):
        return PROJECT_ROOT
    return Path(source).resolve().parent


def _live_config(name: str, inputs: tuple[Any, ...], extra: dict[str, Any],
                 root: Path = PROJECT_ROOT) -> ModelConfig:
    _check_inputs(inputs)
    specs = [
        {"name": f"arg{i}", "shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch.")}
        for i, t in enumerate(inputs)
    ]
    fields = {
        "model.factory": f"live:{name}",
        "model.kwargs": {},
        "model.dtype": "float32",
        "model.device": "auto",
        "model.requires": [],
        "inputs": specs,
        "weights.seed": 0,
        "weights.checkpoint": None,
        "tuning.matmul": MATMUL_DEFAULT,
        "lower.layout": LAYOUT_DEFAULT,
        **extra,
    }
    return ModelConfig(name, Path(f"<live>/{name}"), root, fields)


def compile_config(config: ModelConfig, *, target: str | None = None, out: Path | str | None = None,
                   cache_dir: Path | str | None = None) -> Build:
    """Compile a model config (kiln.load_config("mlp"), or one edited in memory) into `out`
    (default build/NAME); the Build's report is report.json's."""
    target = _checked_target(target)
    out_dir = Path(out) if out else PROJECT_ROOT / "build" / config.name
    root = Path(cache_dir) if cache_dir else default_cache_root()
    result = compile_model(config, BuildOptions(target, out_dir), Cache.open(root))
    return Build(result.out, report_json(result))


def _checked_target(target: str | None) -> str:
    target = target or default_target()
    if target not in TARGETS:
        raise KilnError(f"unknown target {target!r}", f"use one of {', '.join(TARGETS)}")
    return target
