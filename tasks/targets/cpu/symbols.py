"""The names the cpu target's kernels and wrapper agree on."""

from __future__ import annotations


def function_for(key: str) -> str:
    """The C symbol of kernel `key` (every variant of it defines this one name)."""
    return f"kiln_{key[:16]}"
