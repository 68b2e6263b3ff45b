"""Integer ops at their edges, compiled for the cpu target against eager: where C++'s operator or
libm call is undefined or inexact and torch's is not (runtime/kiln_cpu.h)."""

from __future__ import annotations

from pathlib import Path

import torch

from kiln import compile as kiln_compile


class IntegerEdges(torch.nn.Module):
    """Powers past the type (wrapping), past 2**53, and with negative exponents; fmod past 2**53;
    shifts by the width or more and by negative amounts, in each integer width; the lowest
    integer over -1 (x86 traps on it)."""

    def forward(self, i32: torch.Tensor, e32: torch.Tensor, i64: torch.Tensor, e64: torch.Tensor,
                i8: torch.Tensor, s8: torch.Tensor, u8: torch.Tensor, s64: torch.Tensor,
                low32: torch.Tensor, low64: torch.Tensor) -> tuple[torch.Tensor, ...]:
        minus32, minus64 = torch.full_like(low32, -1), torch.full_like(low64, -1)
        return (torch.pow(i32, e32), torch.pow(i32, 21), torch.pow(i64, e64), torch.fmod(i64, e64 + 3),
                torch.bitwise_left_shift(i8, s8), torch.bitwise_right_shift(i8, s8),
                torch.bitwise_right_shift(u8, s8.to(torch.uint8)), torch.bitwise_left_shift(i64, s64),
                torch.bitwise_right_shift(-i64, s64), torch.bitwise_left_shift(i32, e32 + 7),
                low32 // minus32, torch.remainder(low32, minus32), low64 // minus64,
                torch.remainder(low64, minus64), torch.fmod(low64, minus64))


def test_integer_ops_at_their_edges_run_as_eager(tmp_path: Path) -> None:
    inputs = (torch.tensor([3, 7, 0, 2, -1, 1, -3, 5], dtype=torch.int32),
              torch.tensor([25, 21, -1, -1, -3, -7, 5, 33], dtype=torch.int32),
              torch.tensor([3, 2**53 + 1, 0, 2, -1, 2**62 + 12345, -(2**53 + 3), 9007199254740993]),
              torch.tensor([39, 10, -1, -1, -4, 1000, 7, 3]),
              torch.tensor([100, -100, 1, -1, 127, -128, 5, 64], dtype=torch.int8),
              torch.tensor([33, 33, 7, 8, -1, 0, 9, 1], dtype=torch.int8),
              torch.tensor([128, 255, 1, 0, 7, 200, 3, 9], dtype=torch.uint8),
              torch.tensor([-2, 65, 64, 63, 0, 1, -64, 100]),
              torch.full((8,), -2**31, dtype=torch.int32), torch.full((8,), -2**63))
    compiled = kiln_compile(IntegerEdges(), inputs, target="cpu", out=tmp_path / "b",
                            cache_dir=tmp_path / "c")
    for k, (got, want) in enumerate(zip(compiled(*inputs), IntegerEdges()(*inputs), strict=True)):
        assert torch.equal(got, want), (k, got, want)
