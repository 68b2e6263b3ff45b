"""The names the cuda target's wrapper and link agree on."""

from __future__ import annotations


def cubin_symbol(key: str) -> str:
    """The symbol link gives kernel `key`'s cubin (an .incbin of autotune's cubins/<key16>.cubin)."""
    return f"kiln_cubin_{key[:16]}"
