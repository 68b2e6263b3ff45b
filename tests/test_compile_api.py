"""`pipeline.compile` on in-memory modules: output structure, control flow, dtypes, end to end."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from contract.errors import KilnError
from kiln import compile as kiln_compile
from kiln.loader import CompiledModel
from kiln.run_model import flat_tensors


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("api") / "cache"


class Structured(torch.nn.Module):
    """Several outputs in a dict and a tuple; int and bool inputs."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(20, 8)

    def forward(self, ids: torch.Tensor, keep: torch.Tensor) -> dict[str, Any]:
        h = self.embed(ids) * keep.unsqueeze(-1)
        return {"hidden": h, "pooled": (h.sum(1), h.amax(1)), "count": keep.sum(-1)}


class Flipper(torch.nn.Module):
    """A while_loop whose body reads its carried value flipped and transposed while it
    writes the next one: wrong without two sets of carried buffers."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        def body(i: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return i + 1, h.t().contiguous() * 0.5 + h.flip(0)

        loop = torch._higher_order_ops.while_loop
        _, out = loop(lambda i, h: i < 5, body, (torch.tensor(0), x))  # type: ignore[no-untyped-call]
        result: torch.Tensor = out
        return result


class HalfMlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(16, 32)
        self.out = torch.nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.softmax(self.out(F.silu(self.fc(x))).float(), dim=-1)


def _compiled(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...], cache_dir: Path, out: Path) -> Any:
    compiled = kiln_compile(module, inputs, target="cpu", out=out, cache_dir=cache_dir)
    assert isinstance(compiled, CompiledModel), compiled
    return compiled


def test_output_structure_and_integer_inputs(cache_dir: Path, tmp_path: Path) -> None:
    module = Structured().eval()
    ids, keep = torch.randint(0, 20, (4, 6)), torch.rand(4, 6) > 0.5
    compiled = _compiled(module, (ids, keep), cache_dir, tmp_path / "structured")
    ids2, keep2 = torch.randint(0, 20, (4, 6)), torch.rand(4, 6) > 0.5
    got, want = compiled(ids2, keep2), module(ids2, keep2)
    assert isinstance(got, dict)
    assert set(got) == {"hidden", "pooled", "count"}
    assert isinstance(got["pooled"], tuple)
    assert len(got["pooled"]) == 2
    for a, b in zip(flat_tensors(got), flat_tensors(want), strict=True):
        assert a.dtype == b.dtype
        torch.testing.assert_close(a, b)


class ReturnTypes(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> Any:
        return torch.max(x, 1), {"sorted": torch.sort(x, -1, descending=True)}, x.sum()


def test_torch_return_types_come_back_with_their_field_names(cache_dir: Path, tmp_path: Path) -> None:
    """torch.export's serializer knows no torch.return_types class: kiln's spec names a
    namedtuple of the same name and fields instead."""
    x = torch.randn(4, 6)
    got, want = _compiled(ReturnTypes(), (x,), cache_dir, tmp_path / "rt")(x), ReturnTypes()(x)
    assert type(got[0]).__name__ == "max"
    torch.testing.assert_close(got[0].values, want[0].values)
    torch.testing.assert_close(got[0].indices, want[0].indices)
    values, indices = got[1]["sorted"]  # a namedtuple unpacks as the structseq does
    torch.testing.assert_close(values, want[1]["sorted"].values)
    torch.testing.assert_close(indices, want[1]["sorted"].indices)


class Cholesky(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = torch.linalg.cholesky(x) * 2
        return out


def test_an_effectful_check_runs_and_its_error_reaches_the_caller(cache_dir: Path, tmp_path: Path) -> None:
    """torch exports cholesky's error check as an effect on a token: kiln runs the check where
    it stands, so a matrix that is not positive definite fails as in eager, not with NaNs."""
    a = torch.randn(4, 4)
    spd = a @ a.t() + torch.eye(4)
    compiled = _compiled(Cholesky(), (spd,), cache_dir, tmp_path / "chol")
    torch.testing.assert_close(compiled(spd), Cholesky()(spd))
    with pytest.raises(Exception, match="positive-definite"):
        compiled(-spd)


def test_while_loop_double_buffers_carried_values(cache_dir: Path, tmp_path: Path) -> None:
    module = Flipper().eval()
    compiled = _compiled(module, (torch.randn(6, 6),), cache_dir, tmp_path / "flipper")
    x = torch.randn(6, 6)
    torch.testing.assert_close(compiled(x), module(x))


def test_bfloat16_weights_and_inputs(cache_dir: Path, tmp_path: Path) -> None:
    module = HalfMlp().eval().to(torch.bfloat16)
    x = torch.randn(4, 16, dtype=torch.bfloat16)
    compiled = _compiled(module, (x,), cache_dir, tmp_path / "half")
    assert compiled.inputs[0].dtype == "bfloat16"
    x2 = torch.randn(4, 16, dtype=torch.bfloat16)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x2), module(x2), rtol=2e-2, atol=2e-2)


def test_relative_cache_and_build_folders_work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Stages run compilers in folders of their own, so a relative cache path must not reach them."""
    monkeypatch.chdir(tmp_path)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    x = torch.randn(2, 4)
    compiled = kiln_compile(model, (x,), target="cpu", out="rel/build", cache_dir="rel/cache")
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))


def test_the_mean_of_nothing_is_nan_in_var_mean_too(tmp_path: Path) -> None:
    class Moments(torch.nn.Module):
        def forward(self, a: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return (*torch.var_mean(a, unbiased=False), *torch.std_mean(a), a.mean())

    empty = torch.tensor([])
    compiled = kiln_compile(Moments(), (empty,), target="cpu", out=tmp_path / "b", cache_dir=tmp_path / "c")
    for got, want in zip(compiled(empty), Moments()(empty), strict=True):
        torch.testing.assert_close(got, want, equal_nan=True)


def test_an_error_names_the_line_of_a_model_outside_the_project(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A user's model file lives anywhere: errors name its lines relative to its folder."""
    import importlib.util

    source = tmp_path / "my_model.py"
    source.write_text("import torch\n\n\nclass Picky(torch.nn.Module):\n"
                      "    def forward(self, x):\n        return torch.nonzero(x > 0)\n")
    spec = importlib.util.spec_from_file_location("my_model", source)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "my_model", module)  # as an import would
    spec.loader.exec_module(module)
    from contract.errors import KilnError

    with pytest.raises(KilnError, match=r"at my_model\.py:6: return torch\.nonzero"):
        kiln_compile(module.Picky(), (torch.randn(5),), target="cpu", out=tmp_path / "b",
                     cache_dir=tmp_path / "c")


class Attentions(torch.nn.Module):
    """Attention as eager takes it and torch's kernels do not: 3-d and 2-d (no heads), a 2-d
    float mask, a 3-d boolean one, and a 4-d query with a 2-d mask."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor,
                keep: torch.Tensor) -> tuple[torch.Tensor, ...]:
        heads = q.view(2, 8, 2, 2).transpose(1, 2)
        return (F.scaled_dot_product_attention(q, k, k, attn_mask=mask),
                F.scaled_dot_product_attention(q[0], k[0], k[0], attn_mask=keep[0]),
                F.scaled_dot_product_attention(q, k, k, attn_mask=keep, scale=0.3),
                F.scaled_dot_product_attention(q, q, q, is_causal=True),
                F.scaled_dot_product_attention(heads, heads, heads, attn_mask=q[0] @ q[0].t()))


def test_attention_of_fewer_than_four_dims_runs_as_eager(cache_dir: Path, tmp_path: Path) -> None:
    inputs = (torch.randn(2, 8, 4), torch.randn(2, 6, 4), torch.randn(8, 6), torch.rand(2, 8, 6) > 0.3)
    compiled = _compiled(Attentions(), inputs, cache_dir, tmp_path / "b")
    for got, want in zip(compiled(*inputs), Attentions()(*inputs), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


class AttentionsEagerChecks(torch.nn.Module):
    """Attention that eager runs on its math path, since its kernels refuse it: a key and value
    with a batch of one against the query's two, grouped-query heads, a value of another head
    size, a transposed value and query (the last dim strided), an empty query, and a 5-d one
    (eager's math path takes any number of batch dims; torch's kernels take 4)."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, wide: torch.Tensor,
                tall: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (F.scaled_dot_product_attention(q, k[:1], k[:1]),
                F.scaled_dot_product_attention(q, k[:, :2], k[:, :2], enable_gqa=True),
                F.scaled_dot_product_attention(q, k, k, enable_gqa=True),
                F.scaled_dot_product_attention(q, k, wide),
                F.scaled_dot_product_attention(q, k, tall.transpose(-1, -2)),
                F.scaled_dot_product_attention(tall.transpose(-1, -2), k, k, is_causal=True),
                F.scaled_dot_product_attention(q[:, :, :0], k, k),
                F.scaled_dot_product_attention(q.view(2, 2, 2, 8, 16), k.view(2, 2, 2, 8, 16),
                                               k.view(2, 2, 2, 8, 16)))


def test_attention_that_torchs_kernels_refuse_runs_as_eager(cache_dir: Path, tmp_path: Path) -> None:
    # Note: before, the first gave NaNs and the fifth a wrong result, silently; the fourth failed at run time
    inputs = (torch.randn(2, 4, 8, 16), torch.randn(2, 4, 8, 16), torch.randn(2, 4, 8, 32),
              torch.randn(2, 4, 16, 8))
    compiled = _compiled(AttentionsEagerChecks(), inputs, cache_dir, tmp_path / "b")
    for got, want in zip(compiled(*inputs), AttentionsEagerChecks()(*inputs), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


class ChannelsLastNet(torch.nn.Module):
    """A model as a vision user holds it after .to(memory_format=torch.channels_last): its
    convolution weights are permuted in memory, and so is a transposed parameter of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3)
        self.norm = torch.nn.BatchNorm2d(8)
        self.proj = torch.nn.Parameter(torch.randn(6, 8).t())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.norm(self.conv(x))).mean((2, 3)) @ self.proj


def test_a_channels_last_model_with_permuted_weights_runs_as_eager(cache_dir: Path, tmp_path: Path) -> None:
    # Note: before, gen-cpp refused every weight whose strides were not row-major
    module = ChannelsLastNet().eval().to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    assert module.conv.weight.stride() == (27, 1, 9, 3)
    x = torch.randn(2, 3, 10, 10).to(memory_format=torch.channels_last)
    compiled = _compiled(module, (x,), cache_dir, tmp_path / "b")
    for fresh in (x, torch.randn(2, 3, 10, 10)):
        torch.testing.assert_close(compiled(fresh), module(fresh), rtol=1e-5, atol=1e-5)


def test_an_expanded_example_input_takes_any_input_of_its_shape(cache_dir: Path, tmp_path: Path) -> None:
    # Note: before, the input kept the example's stride 0: a caller's full tensor was folded onto one row
    weight = torch.randn(5, 3)
    module = MatmulBy(weight)
    compiled = _compiled(module, (torch.randn(4, 1).expand(4, 5),), cache_dir, tmp_path / "b")
    for x in (torch.randn(4, 5), torch.randn(4, 1).expand(4, 5), torch.randn(5, 4).t()):
        torch.testing.assert_close(compiled(x), module(x))


class MatmulBy(torch.nn.Module):
    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight


class DefaultsAndLoops(torch.nn.Module):
    """A schema's ScalarType default (triu_indices' dtype=long, which the schema gives as 4), and a
    while_loop whose functions read a tensor they close over."""

    def forward(self, x: torch.Tensor, m: torch.Tensor, i: torch.Tensor) -> tuple[torch.Tensor, ...]:
        from torch._higher_order_ops import while_loop

        upper, lower = torch.triu_indices(5, 5, 1), torch.tril_indices(5, 5)
        looped = while_loop(lambda i, y: i < 3, lambda i, y: (i + 1, y + m), (i, x[0]))[1]  # type: ignore[no-untyped-call]
        return x[upper[0], upper[1]], x[lower[0], lower[1]], looped


def test_schema_defaults_and_a_loop_over_a_closed_over_tensor_run_as_eager(cache_dir: Path,
                                                                             tmp_path: Path) -> None:
    inputs = (torch.randn(5, 5), torch.randn(5), torch.tensor(0))
    compiled = _compiled(DefaultsAndLoops(), inputs, cache_dir, tmp_path / "b")
    for got, want in zip(compiled(*inputs), DefaultsAndLoops()(*inputs), strict=True):
        torch.testing.assert_close(got, want)


def test_an_example_input_that_is_not_a_tensor_is_a_clear_error(tmp_path: Path) -> None:
    # Note: before, None (which eager takes for an optional input) ended in an AttributeError
    module = MatmulBy(torch.randn(5, 3))
    with pytest.raises(KilnError, match="example input 1 is NoneType, not a tensor"):
        kiln_compile(module, (torch.randn(4, 5), None), target="cpu", out=tmp_path / "b",
                     cache_dir=tmp_path / "c")
    with pytest.raises(KilnError, match="example_inputs is a Tensor, not a tuple"):
        kiln_compile(module, torch.randn(4, 5), target="cpu", out=tmp_path / "b",  # type: ignore[arg-type]
                     cache_dir=tmp_path / "c")


@torch.library.custom_op("kilnapi::scaled", mutates_args=())
def _scaled(x: torch.Tensor) -> torch.Tensor:
    return x * 3


@_scaled.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


class CallsACustomOp(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _scaled(x) + 1  # type: ignore[no-any-return]


def test_a_loaded_custom_op_is_a_clear_error_that_says_why(tmp_path: Path) -> None:
    # Note: before, the error asked whether the library was loaded, which it was
    with pytest.raises(KilnError, match=r"kilnapi\.scaled\.default is a custom op of the 'kilnapi' library"):
        kiln_compile(CallsACustomOp(), (torch.randn(4),), target="cpu", out=tmp_path / "b",
                     cache_dir=tmp_path / "c")



class RelativePositionBias(torch.nn.Module):
    """BEiT's relative position bias, as transformers writes it: a table interpolated and cat with
    its last rows, indexed by an index built in the graph with slice writes."""

    def __init__(self, w: int = 2, heads: int = 2) -> None:
        super().__init__()
        self.w, self.n = w, (2 * w - 1) ** 2 + 3
        self.table = torch.nn.Parameter(torch.randn(self.n, heads))

    def index(self) -> torch.Tensor:
        w = self.w
        grid = torch.stack(torch.meshgrid(torch.arange(w), torch.arange(w), indexing="ij"))
        coords = torch.flatten(grid, 1)
        rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0).contiguous()
        rel[:, :, 0] += w - 1
        rel[:, :, 1] += w - 1
        rel[:, :, 0] *= 2 * w - 1
        idx = torch.zeros((w * w + 1,) * 2, dtype=rel.dtype)
        idx[1:, 1:] = rel.sum(-1)
        idx[0, 0:] = self.n - 3
        idx[0:, 0] = self.n - 2
        idx[0, 0] = self.n - 1
        return idx

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, side = 2 * self.w - 1, self.w * self.w + 1
        grid = self.table[: self.n - 3].reshape(1, h, h, -1).permute(0, 3, 1, 2)
        grid = F.interpolate(grid, size=(h, h), mode="bilinear")
        table = torch.cat([grid.permute(0, 2, 3, 1).reshape(self.n - 3, -1), self.table[self.n - 3:]])
        return x + table[self.index().view(-1)].view(side, side, -1).permute(2, 0, 1).unsqueeze(0)


def test_beits_relative_position_bias_compiles_and_matches_eager(cache_dir: Path, tmp_path: Path) -> None:
    # Note: before, its kernel's masks knotted through one load: "kiln cannot order them"
    torch.manual_seed(0)
    module = RelativePositionBias().eval()
    x = torch.randn(2, 2, 5, 5)
    compiled = _compiled(module, (x,), cache_dir, tmp_path / "b")
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), module(x), rtol=1e-5, atol=1e-5)
