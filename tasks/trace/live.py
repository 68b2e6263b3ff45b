"""An in-memory module handed to pipeline.compile, for the trace stage to export.

Note: such a module has no key before it is traced. What its forward computes depends on torch's
own module classes and their arguments, attributes, closures and module-level globals, none of
which a digest of source files and weights sees (GELU() and GELU(approximate="tanh") share both).
So trace always exports it, and its entry is keyed by what it wrote (pipeline.keys.output_parts):
the canonical program, its weights and source map. An unchanged module still writes the same
program, so every stage below trace is a hit through early cutoff.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class LiveModel:
    module: Any  # a torch.nn.Module
    args: tuple[Any, ...]
