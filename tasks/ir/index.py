"""Index arithmetic: int64 expressions over loop variables, kept in a simple affine form.

Views become index expressions in their consumers' loads, and a reshape of a reshape is a
floor-division and a modulo of a flattened index. `simplify` takes these back to plain affine
indices where the loop ranges allow it, e.g. with 0 <= d < 64:
    ((h*64 + d) // 64) % 12  ->  h        (h*64 + d) % 768  ->  h*64 + d
so a view that is only a reshape costs the kernels nothing.
"""

from __future__ import annotations

from collections.abc import Mapping

from tasks.ir.dtypes import DType
from tasks.ir.expr import Expr, Op, index, rewrite

Ranges = Mapping[str, int]  # loop variable -> its size (0 <= var < size)
Linear = tuple[dict[Expr, int], int]  # (atom -> coefficient, constant)
_UNBOUNDED = 1 << 62


def const(value: int) -> Expr:
    """An int64 constant index."""
    return index(value)


def linear(e: Expr) -> Linear:
    """e as sum(coef * atom) + const; atoms are variables, loads, divisions and the like."""
    if e.op is Op.CONST and isinstance(e.arg, int):
        return {}, int(e.arg)
    if e.op in (Op.ADD, Op.SUB) and e.dtype is DType.I64:
        (ta, ca), (tb, cb) = linear(e.args[0]), linear(e.args[1])
        sign = 1 if e.op is Op.ADD else -1
        terms = dict(ta)
        for atom, coef in tb.items():
            terms[atom] = terms.get(atom, 0) + sign * coef
        return {a: c for a, c in terms.items() if c}, ca + sign * cb
    if e.op is Op.MUL and e.dtype is DType.I64:
        (ta, ca), (tb, cb) = linear(e.args[0]), linear(e.args[1])
        if not ta:
            return {a: c * ca for a, c in tb.items() if c * ca}, ca * cb
        if not tb:
            return {a: c * cb for a, c in ta.items() if c * cb}, ca * cb
    if e.op is Op.NEG and e.dtype is DType.I64:
        terms, c = linear(e.args[0])
        return {a: -k for a, k in terms.items()}, -c
    return {e: 1}, 0


def fold_divmod(terms: Mapping[Expr, int]) -> tuple[dict[Expr, int], int]:
    """k*q*(x // q) + k*(x % q) -> k*x: a split index put back together."""
    out = dict(terms)
    constant = 0
    for atom, coef in terms.items():
        if atom.op is not Op.MOD or not _is_int_const(atom.args[1]) or atom not in out:
            continue
        x, q = atom.args[0], int(atom.args[1].arg)  # type: ignore[arg-type]
        div = Expr(Op.FLOORDIV, DType.I64, (x, index(q)))
        if out.get(div) != coef * q:
            continue
        del out[atom], out[div]
        x_terms, x_constant = linear(x)
        for a, c in x_terms.items():
            out[a] = out.get(a, 0) + coef * c
        constant += coef * x_constant
    return {a: c for a, c in out.items() if c}, constant


def from_linear(terms: Mapping[Expr, int], constant: int) -> Expr:
    """Rebuild in a fixed order: variables by name, then other atoms by key, constant last."""
    terms, folded = fold_divmod(terms)
    constant += folded

    def order(atom: Expr) -> tuple[int, str, str]:
        return (0 if atom.op is Op.VAR else 1, str(atom.arg) if atom.op is Op.VAR else "", atom.key)

    out: Expr | None = None
    for atom in sorted(terms, key=order):
        coef = terms[atom]
        if coef == 0:
            continue
        term = atom if coef == 1 else Expr(Op.MUL, DType.I64, (atom, index(coef)))
        out = term if out is None else Expr(Op.ADD, DType.I64, (out, term))
    if out is None:
        return index(constant)
    return out if constant == 0 else Expr(Op.ADD, DType.I64, (out, index(constant)))


def bounds(e: Expr, ranges: Ranges) -> tuple[int, int]:
    """Inclusive lower and upper bounds of an index expression (wide when unknown)."""
    terms, lo = linear(e)
    hi = lo
    for atom, coef in terms.items():
        a_lo, a_hi = _atom_bounds(atom, ranges)
        lo += min(coef * a_lo, coef * a_hi)
        hi += max(coef * a_lo, coef * a_hi)
    return max(lo, -_UNBOUNDED), min(hi, _UNBOUNDED)


def _atom_bounds(atom: Expr, ranges: Ranges) -> tuple[int, int]:
    if atom.op is Op.VAR and str(atom.arg) in ranges:
        return 0, ranges[str(atom.arg)] - 1
    if atom.op is Op.FLOORDIV and _is_int_const(atom.args[1]):
        d = int(atom.args[1].arg)  # type: ignore[arg-type]
        lo, hi = bounds(atom.args[0], ranges)
        if d > 0 and abs(lo) < _UNBOUNDED and abs(hi) < _UNBOUNDED:
            return lo // d, hi // d
    if atom.op is Op.MOD and _is_int_const(atom.args[1]):
        m = int(atom.args[1].arg)  # type: ignore[arg-type]
        if m > 0:
            return 0, m - 1
    return -_UNBOUNDED, _UNBOUNDED


def _is_int_const(e: Expr) -> bool:
    return e.op is Op.CONST and isinstance(e.arg, int) and not isinstance(e.arg, bool)


def add(*parts: Expr) -> Expr:
    terms: dict[Expr, int] = {}
    constant = 0
    for part in parts:
        t, c = linear(part)
        constant += c
        for atom, coef in t.items():
            terms[atom] = terms.get(atom, 0) + coef
    return from_linear(terms, constant)


def scale(e: Expr, factor: int) -> Expr:
    terms, c = linear(e)
    return from_linear({a: k * factor for a, k in terms.items()}, c * factor)


def floordiv(e: Expr, d: int, ranges: Ranges) -> Expr:
    """e // d (floor), split as (d*q + r) // d = q + r // d and r // d dropped when 0 <= r < d."""
    if d == 1:
        return e
    if d <= 0:
        raise ValueError(f"floordiv by {d}")
    terms, constant = linear(e)
    if e.op is Op.FLOORDIV and _is_int_const(e.args[1]):
        return floordiv(e.args[0], d * int(e.args[1].arg), ranges)  # type: ignore[arg-type]
    quotient = {a: c // d for a, c in terms.items() if c % d == 0}
    rest = {a: c for a, c in terms.items() if c % d != 0}
    q_const, r_const = divmod(constant, d)
    remainder = from_linear(rest, r_const)
    lo, hi = bounds(remainder, ranges)
    if lo >= 0 and hi < d:
        return from_linear(quotient, q_const)
    coarse = _coarsen(rest, r_const, d, ranges)
    if coarse is not None:  # (g*L + S) // d with 0 <= S < g and g | d: L // (d/g)
        large, g = coarse
        return add(from_linear(quotient, q_const), floordiv(large, d // g, ranges))
    inner = Expr(Op.FLOORDIV, DType.I64, (remainder, index(d)))
    if not quotient and q_const == 0:
        return inner
    return add(from_linear(quotient, q_const), inner)


def mod(e: Expr, m: int, ranges: Ranges) -> Expr:
    """e % m (floor), dropping multiples of m and the modulo itself when 0 <= e < m."""
    if m == 1:
        return index(0)
    if m <= 0:
        raise ValueError(f"mod by {m}")
    terms, constant = linear(e)
    rest = {a: c for a, c in terms.items() if c % m != 0}
    kept = from_linear(rest, constant % m)
    lo, hi = bounds(kept, ranges)
    if lo >= 0 and hi < m:
        return kept
    coarse = _coarsen(rest, constant % m, m, ranges)
    if coarse is not None:  # (g*L + S) % m with 0 <= S < g and g | m: g*(L % (m/g)) + S
        large, g = coarse
        small = from_linear({a: c for a, c in rest.items() if c % g != 0}, constant % m % g)
        return add(scale(mod(large, m // g, ranges), g), small)
    return Expr(Op.MOD, DType.I64, (kept, index(m)))


def _coarsen(terms: Mapping[Expr, int], constant: int, d: int, ranges: Ranges) -> tuple[Expr, int] | None:
    """The largest g | d that splits terms + constant into g*L + S with 0 <= S < g: (L, g)."""
    best: tuple[Expr, int] | None = None
    for coef in sorted({abs(c) for c in terms.values()}, reverse=True):
        g = _gcd(coef, d)
        if g <= 1 or (best is not None and g <= best[1]):
            continue
        large = {a: c // g for a, c in terms.items() if c % g == 0}
        small = from_linear({a: c for a, c in terms.items() if c % g != 0}, constant % g)
        lo, hi = bounds(small, ranges)
        if lo >= 0 and hi < g:
            best = (from_linear(large, constant // g), g)
    return best


def _gcd(a: int, b: int) -> int:
    while b:
        a, b = b, a % b
    return a


def simplify(e: Expr, ranges: Ranges) -> Expr:
    """Re-normalize an int64 index expression bottom-up (after a substitution, say)."""
    if e.dtype is not DType.I64:
        return e

    def step(node: Expr, children: tuple[Expr, ...]) -> Expr | None:
        if node.op is Op.VAR and ranges.get(str(node.arg)) == 1:
            return index(0)  # a loop of one iteration: its variable is always 0
        if node.dtype is not DType.I64 or node.op in (Op.VAR, Op.CONST, Op.LOAD):
            return None
        if node.op is Op.FLOORDIV and _is_int_const(children[1]):
            return floordiv(children[0], int(children[1].arg), ranges)  # type: ignore[arg-type]
        if node.op is Op.MOD and _is_int_const(children[1]):
            return mod(children[0], int(children[1].arg), ranges)  # type: ignore[arg-type]
        if node.op in (Op.ADD, Op.SUB, Op.MUL, Op.NEG):
            rebuilt = Expr(node.op, node.dtype, children, node.arg)
            return from_linear(*linear(rebuilt))
        return None

    return rewrite(e, step)


def flatten_index(indices: tuple[Expr, ...], shape: tuple[int, ...]) -> Expr:
    """Row-major position of an index tuple in a tensor of this shape."""
    parts = []
    stride = 1
    for i, size in reversed(list(enumerate(shape))):
        parts.append(scale(indices[i], stride))
        stride *= size
    return add(*parts) if parts else index(0)


def unflatten_index(flat: Expr, shape: tuple[int, ...], ranges: Ranges) -> tuple[Expr, ...]:
    """The index tuple of a row-major position in a tensor of this shape."""
    out = []
    stride = 1
    for size in reversed(shape):
        out.append(mod(floordiv(flat, stride, ranges), size, ranges) if size != 1 else index(0))
        stride *= size
    return tuple(reversed(out))
