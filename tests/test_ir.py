"""The IR as data: Merkle keys, exact canonical JSON, the verifier's rules, index simplification."""

from __future__ import annotations

import math

import pytest

from tasks.ir import index as ix
from tasks.ir import serialize
from tasks.ir.dtypes import DType
from tasks.ir.expr import Expr, Op, binary, cast, const, load, masked, unary, var, walk
from tasks.ir.nodes import Buffer, BufferKind, Graph, Pointwise, ReduceOp, Reduction, contiguous_strides
from tasks.ir.text import expr_text, graph_text, index_text
from tasks.ir.verify import IRError, verify

F32, I64 = DType.F32, DType.I64


def buf(name: str, shape: tuple[int, ...], dtype: DType = F32, kind: BufferKind = BufferKind.TEMP) -> Buffer:
    return Buffer(name, shape, contiguous_strides(shape), dtype, "cpu", kind)


X = buf("x", (4, 8), kind=BufferKind.INPUT)


def x_at(i: Expr, j: Expr) -> Expr:
    return load("x", F32, (i, j))


def test_equal_expressions_built_apart_share_a_key() -> None:
    a = binary(Op.ADD, x_at(var("i0"), var("i1")), const(1.0, F32))
    b = binary(Op.ADD, x_at(var("i0"), var("i1")), const(1.0, F32))
    assert a is not b
    assert a == b
    assert a.key == b.key
    assert hash(a) == hash(b)
    assert a != binary(Op.ADD, x_at(var("i0"), var("i1")), const(2.0, F32))
    assert const(1, I64) != const(1.0, F32) != const(True, DType.BOOL)


def test_a_shared_subexpression_is_walked_once() -> None:
    e = x_at(var("i0"), var("i1"))
    for _ in range(200):  # a tree of 2^200 paths, a DAG of 203 nodes
        e = binary(Op.ADD, e, e)
    assert len(list(walk(e))) == 203
    table = serialize.ExprTable()
    table.add(e)
    assert len(table.rows) == 203


def test_floats_round_trip_exactly_through_canonical_json() -> None:
    values = [0.1, -0.0, 1e-310, math.pi, math.inf, -math.inf, 3.0]
    body = x_at(var("i0"), var("i1"))
    for v in values:
        body = binary(Op.ADD, body, const(v, F32))
    body = binary(Op.ADD, body, unary(Op.NEG, const(math.nan, F32)))
    graph = Graph((X,), (Pointwise(buf("y", (4, 8)), body, "add"),), ("y",))
    data = serialize.dumps(graph)
    again = serialize.loads(data)
    assert again == graph
    assert serialize.dumps(again) == data
    consts = [e.arg for e in walk(again.nodes[0].body) if e.op is Op.CONST]  # type: ignore[union-attr]
    assert [str(v) for v in consts] == [str(v) for v in [*values, math.nan]]
    assert math.copysign(1.0, consts[1]) == -1.0  # type: ignore[arg-type]


def test_the_verifier_accepts_a_well_formed_graph() -> None:
    body = unary(Op.EXP, x_at(var("i0"), var("i1")))
    red = Reduction((buf("s", (4,)),), ReduceOp.SUM, (4,), (8,), x_at(var("i0"), var("r0")), "sum")
    verify(Graph((X,), (Pointwise(buf("y", (4, 8)), body, "exp"), red), ("y", "s")))


@pytest.mark.parametrize(("body", "rule"), [
    (x_at(var("i0"), var("i2")), "loop variable 'i2' is not in scope"),
    (load("x", F32, (var("i0"),)), "1 indices"),
    (load("nope", F32, (var("i0"), var("i1"))), "unknown buffer 'nope'"),
    (Expr(Op.ADD, F32, (x_at(var("i0"), var("i1")), var("i0"))), "operand dtypes differ"),
    (cast(Expr(Op.EXP, I64, (var("i0"),)), F32), "floating point only"),
    (Expr(Op.WHERE, F32, (x_at(var("i0"), var("i1")), const(1.0, F32), const(2.0, F32))), "condition dtype"),
    (Expr(Op.NEG, F32, ()), "takes 1 operands"),
    (cast(x_at(var("i0"), var("i1")), I64), "body and output dtypes differ"),
])
def test_the_verifier_names_the_broken_rule(body: Expr, rule: str) -> None:
    graph = Graph((X,), (Pointwise(buf("y", (4, 8)), body, "bad"),), ("y",))
    with pytest.raises(IRError, match=rule.replace("(", r"\(").replace(")", r"\)")):
        verify(graph)


def test_the_verifier_checks_reductions_and_outputs() -> None:
    wrong_shape = Reduction((buf("s", (8,)),), ReduceOp.SUM, (4,), (8,), x_at(var("i0"), var("r0")))
    with pytest.raises(IRError, match="shape"):
        verify(Graph((X,), (wrong_shape,), ("s",)))
    with pytest.raises(IRError, match="output 'zz'"):
        verify(Graph((X,), (), ("zz",)))
    welford = Reduction((buf("m", (4,)),), ReduceOp.WELFORD, (4,), (8,), x_at(var("i0"), var("r0")))
    with pytest.raises(IRError, match="wants 2"):
        verify(Graph((X,), (welford,), ("m",)))


R = {"b": 2, "s": 16, "h": 12, "d": 64}


def v(name: str) -> Expr:
    return var(name)


SHD = ix.add(ix.scale(v("s"), 768), ix.scale(v("h"), 64), v("d"))  # flat position in [s, 12, 64]


@pytest.mark.parametrize(("make", "expected"), [
    (lambda: ix.mod(ix.add(ix.scale(v("h"), 64), v("d")), 768, R), "d + h*64"),
    (lambda: ix.floordiv(ix.add(ix.scale(v("h"), 64), v("d")), 64, R), "h"),
    (lambda: ix.mod(ix.floordiv(SHD, 64, R), 12, R), "h"),
    (lambda: ix.floordiv(SHD, 768, R), "s"),
    (lambda: ix.mod(ix.add(v("d"), ix.const(3)), 64, R), "(d + 3)%64"),
    (lambda: ix.floordiv(ix.floordiv(v("d"), 4, R), 4, R), "d//16"),
    (lambda: ix.add(ix.scale(v("d"), 2), ix.scale(v("d"), -2), ix.const(5)), "5"),
])
def test_index_simplification(make: object, expected: str) -> None:
    assert index_text(make()) == expected  # type: ignore[operator]


def test_reshape_round_trip_simplifies_to_the_identity() -> None:
    shape = (2, 16, 12, 64)
    idx = tuple(v(n) for n in "bshd")
    flat = ix.flatten_index(idx, shape)
    assert ix.unflatten_index(flat, shape, R) == idx


def test_a_loop_of_one_iteration_indexes_with_zero() -> None:
    assert ix.simplify(ix.add(v("a"), ix.scale(v("b"), 3)), {"a": 1, "b": 5}) == ix.scale(v("b"), 3)


def test_text_forms_read_well() -> None:
    e = masked(binary(Op.LT, v("i0"), ix.const(7)), x_at(v("i1"), ix.add(v("i0"), ix.const(-7))),
               const(0.0, F32))
    assert expr_text(e) == "t0 = lt i0, 7; t1 = load x[i1, i0 - 7]; t2 = masked t0, t1, 0.0; -> t2"
    tanh = Pointwise(buf("y", (4, 8)), unary(Op.TANH, x_at(v("i0"), v("i1"))), "tanh")
    graph = Graph((X,), (tanh,), ("y",))
    assert graph_text(graph) == (
        "input x: f32[4, 8] stride [8, 1]\n"
        "y: f32[4, 8] = pointwise\n"
        "  t0 = load x[i0, i1]\n"
        "  t1 = tanh t0\n"
        "  -> t1\n"
        "return y\n"
    )


def _eval_index(e: Expr, env: dict[str, int]) -> int:
    if e.op is Op.VAR:
        return env[str(e.arg)]
    if e.op is Op.CONST:
        return int(e.arg)  # type: ignore[arg-type]
    a = [_eval_index(x, env) for x in e.args]
    ops = {Op.ADD: lambda: a[0] + a[1], Op.SUB: lambda: a[0] - a[1], Op.MUL: lambda: a[0] * a[1],
           Op.FLOORDIV: lambda: a[0] // a[1], Op.MOD: lambda: a[0] % a[1], Op.NEG: lambda: -a[0]}
    return int(ops[e.op]())


def test_split_indices_simplify_exactly() -> None:
    """floordiv / mod of affine indices, coarsened by a common factor and folded back into
    plain variables, agree with Python's integers at every point of random loop nests."""
    import itertools
    import random

    from tasks.ir import index as ix

    rng = random.Random(0)
    names = ["i0", "i1", "i2"]
    for _ in range(300):
        ranges = {n: rng.choice([1, 2, 3, 4, 6, 8, 16]) for n in names}
        coefs = [rng.choice([0, 1, 2, 3, 4, 8, 16, 24, 32, 64, -4, -1]) for _ in names]
        constant = rng.choice([0, 1, 5, -3, 16])
        e = ix.add(*(ix.scale(var(n), c) for n, c in zip(names, coefs, strict=True)), ix.const(constant))
        d = rng.choice([2, 3, 4, 8, 16, 32, 64, 96])
        q, r = ix.floordiv(e, d, ranges), ix.mod(e, d, ranges)
        rebuilt = ix.simplify(ix.add(ix.scale(q, d), r), ranges)
        for point in itertools.product(*(range(ranges[n]) for n in names)):
            env = dict(zip(names, point, strict=True))
            value = _eval_index(e, env)
            assert _eval_index(q, env) == value // d, (index_text(e), d, index_text(q))
            assert _eval_index(r, env) == value % d, (index_text(e), d, index_text(r))
            assert _eval_index(rebuilt, env) == value


def test_a_reshape_round_trip_is_the_identity() -> None:
    from tasks.ir import index as ix

    i0, i1 = var("i0"), var("i1")
    ranges = {"i0": 64, "i1": 512}
    flat = ix.add(ix.scale(i0, 512), i1)
    back = ix.add(ix.scale(ix.floordiv(flat, 16384, ranges), 32), ix.mod(i0, 32, ranges))
    assert index_text(ix.floordiv(flat, 16384, ranges)) == "i0//32"
    assert back == i0
