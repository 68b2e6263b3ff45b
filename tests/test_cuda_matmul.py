"""Matmul templates on the GPU (gpu marker; needs CUDA): a matmul call and the pointwise kernel
after it run as one Triton kernel (tasks/codegen/triton_matmul.py), shipped where tuning.matmul
says: always ("template"), or where tune.py timed it faster than the library's call and kernel
("auto"). Either way the model matches eager."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

LIBRARY_CALLS = re.compile(r"kiln::(mm|bmm|addmm|baddbmm)\(")


def _block() -> object:
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Block(nn.Module):
        """A linear layer on (batch, tokens, features) into a GELU, one into a residual add, and
        a scaled bmm over a transposed operand: three pairs, each of another epilogue."""

        def __init__(self) -> None:
            super().__init__()
            self.up = nn.Linear(64, 256)
            self.down = nn.Linear(256, 64)

        def forward(self, x: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, ...]:
            y = self.down(F.gelu(self.up(x))) + x
            return y, torch.bmm(q, k.transpose(1, 2)) * 0.125

    torch.manual_seed(0)
    return Block().eval()


@pytest.mark.parametrize("matmul", ["template", "auto"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_a_matmul_and_its_epilogue_as_one_kernel_match_eager(dtype: str, matmul: str, tmp_path: Path) -> None:
    import torch

    import kiln
    from tests.test_cuda_end_to_end import matches_on_fresh_inputs

    kind = getattr(torch, dtype)
    model: torch.nn.Module = _block().to("cuda", kind)  # type: ignore[attr-defined]
    shapes = ((2, 24, 64), (4, 32, 16), (4, 40, 16))  # x, q, k
    inputs = tuple(torch.randn(*shape, device="cuda", dtype=kind) for shape in shapes)
    compiled = kiln.compile(model, inputs, target="cuda", out=tmp_path / "b", cache_dir=tmp_path / "c",
                            **{"tuning.matmul": matmul})
    (wrapper,) = (tmp_path / "c").rglob("gen-cpp/*/wrapper.cpp")
    report = json.loads((tmp_path / "b" / "report.json").read_text())
    pairs = [row for row in report["kernels"] if row["kernel"].startswith("mm_")]
    assert len(pairs) == 3, [row["kernel"] for row in report["kernels"]]
    assert all(row["tuned"] for row in pairs), pairs
    fused = [row for row in pairs if row["variant"].startswith("matmul")]
    if matmul == "template":
        assert len(fused) == 3
        assert not LIBRARY_CALLS.search(wrapper.read_text())
    else:  # what won: each fused pair's call is gone from the wrapper
        assert len(LIBRARY_CALLS.findall(wrapper.read_text())) == 3 - len(fused)
    matches_on_fresh_inputs(compiled, model, inputs)
