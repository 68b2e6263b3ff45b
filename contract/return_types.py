"""torch.return_types results (torch.max(x, 1), torch.sort, torch.median ...) as a model's output.

torch.export's serializer knows no structseq class (a torch.return_types.median in an output
spec fails it). So the output spec names, in its place, a namedtuple of the same name and fields,
registered with pytree as "kiln.return_types.<name>"; load() registers the same classes, and the
caller gets `.values` and `.indices` (and indexing) as eager gives them.
"""

from __future__ import annotations

import collections
import re
from typing import Any

PREFIX = "kiln.return_types."
_MADE: dict[str, type] = {}


def namedtuple_for(name: str) -> type:
    """The registered namedtuple standing for torch.return_types.<name>."""
    if name not in _MADE:
        import torch
        from torch.utils import _pytree

        structseq = getattr(torch.return_types, name)
        probe = structseq(tuple(range(structseq.n_fields)))
        fields = sorted((f for f in dir(structseq) if not f.startswith("_") and f not in _TUPLE_ATTRIBUTES),
                        key=lambda f: getattr(probe, f))
        made = collections.namedtuple(name, fields)  # type: ignore[misc]
        _pytree._register_namedtuple(made, serialized_type_name=PREFIX + name)
        _MADE[name] = made
    return _MADE[name]


_TUPLE_ATTRIBUTES = {"count", "index", "n_fields", "n_sequence_fields", "n_unnamed_fields"}


def portable_spec(spec: Any) -> Any:
    """A pytree spec with every structseq node replaced by its namedtuple (the same spec if none)."""
    from torch.utils import _pytree

    old = _children(spec)
    children = [portable_spec(child) for child in old]
    if _pytree.is_structseq_class(spec.type):
        made = namedtuple_for(spec.type.__name__)
        return _pytree.TreeSpec(made, made, children)
    if all(new is was for new, was in zip(children, old, strict=True)):
        return spec
    return _pytree.TreeSpec(spec.type, spec.context, children)


def _children(spec: Any) -> list[Any]:
    # Note: torch 2.13 deprecates children_specs for children(); torch 2.11 has only the field.
    return list(spec.children()) if callable(getattr(spec, "children", None)) else list(spec.children_specs)


def register_named_in(serialized_spec: str) -> None:
    """Register the namedtuples a serialized spec names, so treespec_loads can read it."""
    for name in sorted(set(re.findall(re.escape(PREFIX) + r"(\w+)", serialized_spec))):
        namedtuple_for(name)
