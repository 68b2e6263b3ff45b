"""kiln's Python API: compile a model, load a build, and the reference a build is checked against.

    from kiln import compile, load

- compile(module, example_inputs): an in-memory torch.nn.Module; returns the loaded model.
- compile_config(load_config("mlp")): a model config, as `kiln compile mlp` does; a Build.
- load(build_dir): a build folder as a callable on tensors.
- kiln.run_model: the model's eager reference (its factory and seeded weights), random inputs
  and the error between outputs, as `kiln run` and the benchmarks use them.

Importing this package stays cheap: nothing here imports torch or the engine until a compile
or a load needs it. The CLI (cli/) and the benchmarks (bench/) sit on top of it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from contract.config import ModelConfig, load_config
from contract.errors import KilnError

if TYPE_CHECKING:
    from kiln.api import Build


def compile(model: Any, example_inputs: tuple[Any, ...], **kwargs: Any) -> Any:
    from kiln.api import compile as _compile

    return _compile(model, example_inputs, **kwargs)


def compile_config(config: ModelConfig, **kwargs: Any) -> Build:
    from kiln.api import compile_config as _compile_config

    return _compile_config(config, **kwargs)


def load(build_dir: Path | str, *, verify: bool = True, graphs: bool | None = None) -> Any:
    from kiln.loader import load as _load

    return _load(build_dir, verify=verify, graphs=graphs)


__all__ = ["KilnError", "ModelConfig", "compile", "compile_config", "load", "load_config"]
