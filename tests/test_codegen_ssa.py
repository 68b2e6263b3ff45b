"""The SSA walk both expression writers share: every node named once, a masked body's node
written under its masks' condition, whichever order the roots reach the masks in."""

from __future__ import annotations

from tasks.codegen.cpp_expr import ExprWriter
from tasks.codegen.ssa import mask_contexts
from tasks.ir.dtypes import DType
from tasks.ir.expr import Expr, Op, binary, const, load, masked, unary, var


def _shared_under_two_masks() -> tuple[Expr, Expr, Expr]:
    """A load reached only inside two masked bodies (rotate-half's cat in llama's rotary
    embedding does this): its guard names both masks."""
    x = var("x0")
    shared = unary(Op.EXP, load("in0", DType.F32, (x,)))
    low = binary(Op.LT, x, const(4, DType.I64))
    high = binary(Op.GE, x, const(4, DType.I64))
    first = masked(low, shared, const(0.0, DType.F32))
    second = masked(high, binary(Op.MUL, shared, const(2.0, DType.F32)), const(0.0, DType.F32))
    return binary(Op.ADD, first, second), low, high


def test_a_node_under_two_masks_is_guarded_by_either() -> None:
    root, low, high = _shared_under_two_masks()
    guards = mask_contexts([root])
    shared = next(k for k, g in guards.items() if "||" in g)
    assert guards[shared] == " || ".join(sorted((f"(@{low.key})", f"(@{high.key})")))


def test_every_mask_a_guard_names_is_written_before_the_guarded_node() -> None:
    root, _, _ = _shared_under_two_masks()
    guards_seen: list[str | None] = []

    def load_text(e: Expr, index: list[str], guard: str | None) -> str:
        guards_seen.append(guard)
        return f"in0[{index[0]}]" if guard is None else f"(({guard}) ? in0[{index[0]}] : 0.0f)"

    lines = ExprWriter(load_text, {"x0": 8}).emit([root])
    (guard,) = [g for g in guards_seen if g is not None]
    for name in guard.replace("(", " ").replace(")", " ").replace("||", " ").split():
        defined = next(i for i, line in enumerate(lines) if line.split(" = ")[0].endswith(f" {name}"))
        assert defined < next(i for i, line in enumerate(lines) if "in0[" in line)


def test_a_context_inside_another_is_absorbed() -> None:
    """(a) || (a && b) is (a): the guard never waits on a mask it does not need."""
    x = var("x0")
    outer = binary(Op.LT, x, const(6, DType.I64))
    value = load("in0", DType.F32, (x,))
    inner = binary(Op.GT, value, const(0.0, DType.F32))
    shared = unary(Op.EXP, value)
    body = binary(Op.ADD, shared, masked(inner, shared, const(0.0, DType.F32)))
    guards = mask_contexts([masked(outer, body, const(0.0, DType.F32))])
    assert guards[shared.key] == f"(@{outer.key})"


def test_masks_whose_bodies_nest_each_other_are_ordered_or_refused_not_recursed() -> None:
    """Found in review: A under B in one place and B under A in another made each mask need
    the other. Only loads wait for their masks now, so index and value nodes never do."""
    x = var("x0")
    masks = {n: binary(Op.LT, x, const(k, DType.I64)) for n, k in (("x", 6), ("y", 5), ("a", 4), ("b", 3))}
    value = unary(Op.EXP, load("in0", DType.F32, (x,)))
    zero = const(0.0, DType.F32)
    left = masked(masks["x"], masked(masks["a"], masked(masks["b"], value, zero), zero), zero)
    right = masked(masks["y"], masked(masks["b"], masked(masks["a"], value, zero), zero), zero)
    guards: list[str | None] = []

    def load_text(e: Expr, index: list[str], guard: str | None) -> str:
        guards.append(guard)
        return "in0[0]"

    ExprWriter(load_text, {"x0": 8}).emit([binary(Op.ADD, left, right)])  # recursed without end before
    (guard,) = guards
    assert guard is not None
    assert (guard.count("||"), guard.count("&&")) == (1, 4)


def test_a_knot_of_masks_is_a_clear_error_naming_the_kernel() -> None:
    """A load read under mask A to compute mask M, and under M too (BEiT's relative position
    bias makes one): the writer cannot order it, and the compile says which kernel, from where."""
    import types

    import pytest

    from contract.errors import KilnError
    from tasks.gen_tuning.stage import written

    x = var("x0")
    value = load("in0", DType.I64, (x,))
    first = masked(binary(Op.LT, x, const(4, DType.I64)), value, const(0, DType.I64))
    second = masked(binary(Op.LT, first, const(3, DType.I64)), value, const(0, DType.I64))
    root = binary(Op.ADD, first, second)

    def write() -> list[str]:
        return ExprWriter(lambda e, index, guard: f"in0[{index[0]}]", {"x0": 8}).emit([root])

    kernel = types.SimpleNamespace(name="k1", origins=("add_2", "index_3"))
    with pytest.raises(KilnError, match=r"kiln cannot write kernel k1 \(from the graph's add_2, index_3\)"):
        written(kernel, write)  # type: ignore[arg-type]
