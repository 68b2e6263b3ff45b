"""A model's eager reference, for `kiln run MODEL` (a build on random inputs next to eager
PyTorch, with the max error and the latency of each), the benchmarks and users: the config's
module with its seeded weights, a build's weights or a checkpoint, and inputs."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contract.config import ModelConfig

INPUT_SEED = 1  # not the trace's seed (0): the build must work on inputs it never saw


def eager_model(config: ModelConfig, build_dir: Path) -> Any:
    """The config's module in eval mode, with the build's weights loaded into it."""
    import torch
    from safetensors.torch import load_file

    from tasks.trace.factory import build_model

    names = ("model.factory", "model.kwargs", "model.dtype", "weights.seed")
    fields = {name: config.field(name) for name in names}
    module = build_model(fields, config.name, config.project_root).eval()
    weights = build_dir / "weights.safetensors"
    if weights.is_file():
        state = module.state_dict()
        loaded = {k: v for k, v in load_file(str(weights)).items() if k in state}
        module.load_state_dict(loaded, strict=False)
    torch.set_grad_enabled(False)
    return module


def seeded_model(config: ModelConfig, seed: int | None = None) -> Any:
    """The config's module with its seeded weights (weights.seed, or `seed`), no checkpoint."""
    from tasks.trace.factory import build_model

    fields = {name: config.job_value(name) for name in config.fields}
    if seed is not None:
        fields["weights.seed"] = seed
    return build_model(fields, config.name, config.project_root)


def model_factory(config: ModelConfig) -> Any:
    """The function model.factory names, imported (its signature says what kwargs it takes)."""
    from tasks.trace.factory import import_factory

    return import_factory(config.field("model.factory"), config.name)


def load_checkpoint(module: Any, config: ModelConfig) -> None:
    """The config's weights.checkpoint, loaded into `module` (as trace loads it)."""
    from tasks.weights.files import load_checkpoint as load_into

    if config.checkpoint is not None:
        load_into(module, config.checkpoint, config.name)


def random_inputs(config: ModelConfig, seed: int = INPUT_SEED) -> tuple[Any, ...]:
    from tasks.trace.factory import example_inputs

    return example_inputs(config.field("inputs"), seed)


def flat_tensors(value: Any) -> list[Any]:
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, list | tuple):
        return [t for v in value for t in flat_tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in flat_tensors(v)]
    return []


def max_error(got: Any, want: Any) -> float:
    pairs = list(zip(flat_tensors(got), flat_tensors(want), strict=True))
    if not pairs:
        return 0.0
    return max(float((a.double() - b.double()).abs().max()) if a.numel() else 0.0 for a, b in pairs)


def median_seconds(fn: Callable[[], Any], repeat: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


@dataclass(frozen=True)
class RunResult:
    max_error: float
    kiln_seconds: float
    eager_seconds: float
    inputs: Sequence[str]


def run_build(config: ModelConfig, build_dir: Path, repeat: int = 20) -> RunResult:
    import torch

    from kiln.loader import load

    compiled = load(build_dir)
    model = eager_model(config, build_dir)
    inputs = random_inputs(config)
    sync: Callable[[], None] = lambda: None  # noqa: E731
    if compiled.target == "cuda":
        model = model.cuda()
        inputs = tuple(t.cuda() if isinstance(t, torch.Tensor) else t for t in inputs)
        sync = torch.cuda.synchronize
    error = max_error(compiled(*inputs), model(*inputs))

    def timed(fn: Callable[[], Any]) -> Callable[[], None]:
        def call() -> None:
            fn()
            sync()  # a GPU run is timed to its end, not to its launch
        return call

    kiln_s = median_seconds(timed(lambda: compiled(*inputs)), repeat)
    eager_s = median_seconds(timed(lambda: model(*inputs)), repeat)
    shapes = [f"{info.name}: {info.dtype}{list(info.shape)}" for info in compiled.inputs]
    return RunResult(error, kiln_s, eager_s, shapes)
