"""A model that mutates its inputs or buffers in forward(): kiln writes the new values back, as
eager leaves them: an input into the caller's tensor, a buffer into the model's own copy of its
weights (so the next call sees it). The GPU test runs the same on the H200 (make test-gpu)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kiln import compile as kiln_compile


class Mutating(torch.nn.Module):
    count: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("count", torch.zeros(()))
        self.bn = torch.nn.BatchNorm1d(3)

    def forward(self, x: torch.Tensor, y: torch.Tensor, i: torch.Tensor) -> tuple[torch.Tensor, ...]:
        x.add_(1)
        self.count += 1
        y[:, 0] = 7.0
        y.index_put_((i,), torch.ones(3, device=y.device), accumulate=True)
        stats = (self.bn.running_mean, self.bn.num_batches_tracked)
        assert stats[0] is not None
        assert stats[1] is not None
        return x * 2 + self.count, self.bn(y), stats[0] * 1, stats[1] * 1


def check_against_eager(device: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = Mutating().to(device).train()
    x, y = torch.randn(4, 3, device=device), torch.randn(4, 3, device=device)
    i = torch.tensor([0, 2, 2], device=device)
    compiled = kiln_compile(model, (x.clone(), y.clone(), i), target=device, out=tmp_path / "b",
                            cache_dir=tmp_path / "c")
    for _ in range(3):  # the buffers' state carries from one call to the next, in both
        x_eager, y_eager, x_kiln, y_kiln = x.clone(), y.clone(), x.clone(), y.clone()
        want = model(x_eager, y_eager, i)
        got = compiled(x_kiln, y_kiln, i)
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w)
        torch.testing.assert_close(x_kiln, x_eager)
        torch.testing.assert_close(y_kiln, y_eager)
    assert model.training  # compiled in the mode it was in, and left so


def test_mutated_inputs_and_buffers_are_written_back(tmp_path: Path) -> None:
    check_against_eager("cpu", tmp_path)


def test_a_strided_input_is_written_back_through_its_strides(tmp_path: Path) -> None:
    class AddInPlace(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x.mul_(3)
            return x.sum(0)

    base = torch.randn(5, 4)
    example = base.t()  # not contiguous: kiln stages it, and must write the caller's tensor
    compiled = kiln_compile(AddInPlace(), (example.clone(),), target="cpu", out=tmp_path / "b",
                            cache_dir=tmp_path / "c")
    got_input, want_input = base.clone(), base.clone()
    torch.testing.assert_close(compiled(got_input.t()), AddInPlace()(want_input.t()))
    torch.testing.assert_close(got_input, want_input)


def test_a_parameter_updated_without_grad_is_written_back(tmp_path: Path) -> None:
    class Counter(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(3))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            with torch.no_grad():
                self.w.add_(x)
            return self.w * 1

    x = torch.randn(3)
    compiled = kiln_compile(Counter(), (x,), target="cpu", out=tmp_path / "b", cache_dir=tmp_path / "c")
    compiled(x)
    torch.testing.assert_close(compiled(x), 2 * x)


def test_training_mode_is_kept_and_said(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.BatchNorm1d(3)).train()
    kiln_compile(model, (torch.randn(4, 3),), target="cpu", out=tmp_path / "b", cache_dir=tmp_path / "c")
    assert "training mode" in capfd.readouterr().err
    assert model.training


@pytest.mark.gpu
def test_mutation_is_written_back_on_the_gpu(tmp_path: Path) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (make test-gpu on the device machine)")
    check_against_eager("cuda", tmp_path)
