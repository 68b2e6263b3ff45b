"""In-memory modules that one key must never confuse: pairs with the same weights and the same
classes (or the same source files) that compute different things.

Run as a script, it compiles one side of every pair into a shared cache and checks each build
against eager:  python -m tests.live_cases CACHE_DIR OUT_DIR SIDE   (SIDE: 0 or 1). The module
global `SCALE` comes from $KILN_TEST_SCALE, so two processes run the same source with different
values.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

import torch

SCALE = float(os.environ.get("KILN_TEST_SCALE", "2.0"))


def scaled(x: torch.Tensor) -> torch.Tensor:
    """A module-level helper that reads a module-level global."""
    return x * SCALE


class Flagged(torch.nn.Module):
    """forward branches on a constructor flag: one class, one source, two programs."""

    def __init__(self, lin: torch.nn.Linear, exp: bool) -> None:
        super().__init__()
        self.lin = lin
        self.exp = exp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h: torch.Tensor = self.lin(x)
        return h.exp() if self.exp else h.cos()


class Helped(torch.nn.Module):
    def __init__(self, lin: torch.nn.Linear) -> None:
        super().__init__()
        self.lin = lin

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return scaled(self.lin(x))


class OneOp(torch.nn.Module):
    """A wrapper around one function: many instances of one class, each its own op."""

    def __init__(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x)


def shared_linear() -> torch.nn.Linear:
    torch.manual_seed(0)
    return torch.nn.Linear(16, 8)


def pairs(lin: torch.nn.Linear) -> dict[str, tuple[torch.nn.Module, torch.nn.Module]]:
    """name -> (side 0, side 1): each pair shares its weights and its classes."""
    return {
        "relu-sigmoid": (torch.nn.Sequential(lin, torch.nn.ReLU()),
                         torch.nn.Sequential(lin, torch.nn.Sigmoid())),
        "gelu-tanh": (torch.nn.Sequential(lin, torch.nn.GELU()),
                      torch.nn.Sequential(lin, torch.nn.GELU(approximate="tanh"))),
        "flag": (Flagged(lin, exp=True), Flagged(lin, exp=False)),
    }


ONE_OPS: tuple[Callable[[torch.Tensor], torch.Tensor], ...] = (
    torch.sin, torch.cos, lambda x: x.sum(-1), lambda x: x.to(torch.float64) * 3, lambda x: x.t() + 1,
)


def check(module: torch.nn.Module, x: torch.Tensor, cache: Path, out: Path) -> float:
    """Compile module, run the build on a fresh input, return the max error against eager."""
    from kiln import compile as kiln_compile

    compiled = kiln_compile(module, (x,), target="cpu", cache_dir=cache, out=out)
    fresh = torch.randn_like(x)
    with torch.no_grad():
        got, want = compiled(fresh), module(fresh)
    assert got.shape == want.shape
    assert got.dtype == want.dtype
    return float((got.double() - want.double()).abs().max())


def main(argv: list[str]) -> int:
    cache, out, side = Path(argv[0]), Path(argv[1]), int(argv[2])
    lin = shared_linear()
    x = torch.randn(4, 16)
    errors = {name: check(pair[side], x, cache, out / name) for name, pair in pairs(lin).items()}
    errors["helper"] = check(Helped(lin), x, cache, out / "helper")
    for name, err in errors.items():
        print(f"{name} {err:.3g}")
    return 0 if all(err < 1e-5 for err in errors.values()) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
