"""Real models as users hold them, through kiln.compile, against eager (scripts/zoo.py's check):
tiny configs of transformers' decoders (their KV cache on, as by default), encoder-decoders and
an encoder, and BatchNorm blocks. The GPU machine runs the whole zoo:
`python scripts/zoo.py --target cuda`."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from scripts.zoo import build, interleaved, run_one


# Note: six transformers families with default configs made tiny: decoders with a KV cache
# (gpt2, llama, opt), encoder-decoders (t5, bart) and an encoder (bert).
@pytest.mark.parametrize("model", ["hf:gpt2", "hf:llama", "hf:opt", "hf:t5", "hf:bart", "hf:bert",
                                   "block:bn_block", "block:bn_inplace_relu"])
def test_a_zoo_model_matches_eager(model: str, tmp_path: Path) -> None:
    if model.startswith("hf:"):
        pytest.importorskip("transformers")
    found = run_one(model, "cpu", "float32", False, tmp_path / "cache", tmp_path / "build")
    assert found["status"] == "ok", found


def test_a_decoders_kv_cache_is_turned_off_for_the_compile_and_back_on_after(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("transformers")
    import kiln

    module, inputs_for = build("hf:gpt2", full=False)
    module.eval()
    assert module.config.use_cache
    inputs = inputs_for(1)
    compiled = kiln.compile(module, inputs, target="cpu", out=tmp_path / "b", cache_dir=tmp_path / "c")
    assert "use_cache turned off" in capfd.readouterr().err
    assert module.config.use_cache  # the user's module is as it was
    got = compiled(*inputs)
    assert type(got).__name__ == "CausalLMOutputWithCrossAttentions"
    assert got.past_key_values is None
    with torch.no_grad():
        torch.testing.assert_close(got.logits, module(*inputs).logits, rtol=1e-4, atol=1e-4)


def test_an_encoder_keeps_its_config_and_is_not_warned_about() -> None:
    """BERT's config has use_cache on too, but an encoder returns no cache: nothing to turn off."""
    pytest.importorskip("transformers")
    from tasks.trace.export import _generates, _without_kv_cache

    encoder, _ = build("hf:bert", full=False)
    decoder, _ = build("hf:gpt2", full=False)
    with _without_kv_cache(encoder, _generates(encoder)) as turned_off:
        assert not turned_off
    with _without_kv_cache(decoder, _generates(decoder)) as turned_off:
        assert turned_off
        assert not decoder.config.use_cache
    assert decoder.config.use_cache


class PassesTheMask(torch.nn.Module):
    """What transformers 5 makes users write for a decoder whose forward takes its cache second
    (falcon, gptj, bloom): a module of their own that passes the mask by name."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> Any:
        return self.model(input_ids=ids, attention_mask=mask)  # its output as it is, its cache too


def test_a_decoders_base_model_and_a_wrapper_of_it_compile_with_their_cache_off(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    # Note: before, both failed: export found the DynamicCache that nobody asked for in the output
    transformers = pytest.importorskip("transformers")
    import kiln

    config = transformers.LlamaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, intermediate_size=64, vocab_size=128)
    torch.manual_seed(0)
    base = transformers.LlamaModel(config).eval()  # AutoModel's: it does not generate
    ids, mask = torch.randint(0, 128, (2, 8)), torch.ones(2, 8, dtype=torch.long)
    mask[1, 6:] = 0
    for name, module in (("base", base), ("wrapped", PassesTheMask(base))):
        compiled = kiln.compile(module, (ids, mask), target="cpu", out=tmp_path / name,
                                cache_dir=tmp_path / "c")
        assert "use_cache turned off" in capfd.readouterr().err
        assert base.config.use_cache
        with torch.no_grad():
            got, want = compiled(ids, mask), module(ids, mask)
        assert got.past_key_values is None
        torch.testing.assert_close(got.last_hidden_state, want.last_hidden_state, rtol=1e-4, atol=1e-4)


def test_a_model_whose_outputs_say_little_is_checked_at_its_heads_input(tmp_path: Path) -> None:
    found = run_one("block:zero_head", "cpu", "float32", False, tmp_path / "cache", tmp_path / "build")
    assert found["status"] == "ok", found
    assert "a weak check" in found["error"]
    assert found["head_input_says_little"] is False
    assert found["head_input_error"] < 1e-5
    assert "the head's input (is informative)" in found["error"]


def test_a_head_input_that_differs_fails_the_model() -> None:
    from scripts.zoo import judged_below_head

    weak = {"status": "ok", "error": "eager's outputs are each one value"}
    below = {"head_input_error": 0.5, "head_input_says_little": False}
    assert judged_below_head(below, "float16", weak)["status"] == "mismatch"
    assert judged_below_head({}, "float16", weak) == {}


def test_a_resumed_zoo_runs_again_what_it_could_not_judge(tmp_path: Path) -> None:
    import json

    from scripts.zoo import _earlier_results

    weak = "eager's outputs are each one value (a zero-initialized head?): a weak check"
    rows = [{"model": "tv:a", "status": "ok"}, {"model": "tv:b", "status": "not run"},
            {"model": "tv:c", "status": "ok", "error": weak},
            {"model": "tv:d", "status": "ok", "error": weak, "head_input_error": 0.0,
             "head_input_says_little": False, "calibrated_norms": 0},
            {"model": "tv:f", "status": "ok", "error": weak, "head_input_error": 0.0,
             "head_input_says_little": True},  # weak below the head too, from before calibrate_norms
            {"model": "tv:g", "status": "ok", "error": weak, "head_input_error": 0.0,
             "head_input_says_little": False},  # informative below the head: calibration changes nothing
            {"model": "seg:h", "status": "ok", "error": weak, "calibrated_norms": 3}]  # no Linear head
    path = tmp_path / "results.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n{\"model\": \"tv:e\", \"sta")
    assert sorted(_earlier_results(path)) == ["seg:h", "tv:a", "tv:d", "tv:g"]


def test_calibrated_batchnorms_normalize_what_they_see_and_keep_their_momentum() -> None:
    import torch
    from torch import nn

    from scripts.zoo import calibrate_norms

    torch.manual_seed(0)
    untracked = nn.BatchNorm2d(4, track_running_stats=False)
    module = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8, momentum=0.3), nn.ReLU(),
                           nn.Conv2d(8, 4, 1), nn.BatchNorm2d(4), untracked, nn.Dropout(0.9)).eval()
    inputs = (torch.randn(8, 3, 16, 16) * 7 + 5,)
    assert calibrate_norms(module, lambda: inputs) == 2
    assert module[1].momentum == 0.3
    assert module[4].momentum == 0.1
    assert not any(m.training for m in module.modules())
    assert calibrate_norms(nn.Linear(2, 2), lambda: pytest.fail("inputs made for no BatchNorm")) == 0
    with torch.no_grad():
        normalized = module[:5](*inputs)
    mean, var = normalized.mean(dim=(0, 2, 3)), normalized.var(dim=(0, 2, 3))
    assert torch.allclose(mean, torch.zeros(4), atol=1e-3), mean
    assert torch.allclose(var, torch.ones(4), atol=1e-2), var
    assert module[1].num_batches_tracked.item() == 1  # type: ignore[operator]


def test_the_zoo_runs_one_of_each_kind_before_the_second_of_any() -> None:
    models = ["tv:resnet101", "tv:resnet18", "tv:resnet50", "tv:vgg13", "tv:vgg11", "hf:bert",
              "timm:resnet18"]
    assert interleaved(models) == ["hf:bert", "timm:resnet18", "tv:resnet18", "tv:vgg11", "tv:resnet50",
                                   "tv:vgg13", "tv:resnet101"]


def test_the_zoo_check_counts_nans_and_infs_instead_of_losing_them() -> None:
    from scripts.zoo import compare

    nan, inf = float("nan"), float("inf")
    want = torch.tensor([1.0, 2.0, 4.0])
    assert compare([(want + 0.04, want)]) == pytest.approx((0.01, 0))
    assert compare([(torch.tensor([nan, nan, nan]), want)])[0] == float("inf")  # kiln gives NaN
    assert compare([(torch.tensor([1.0, inf, 4.0]), want)])[0] == float("inf")
    both = torch.tensor([nan, 2.0, -inf])
    assert compare([(both.clone(), both)]) == (0.0, 2)  # non-finite where eager has it: counted
    assert compare([(torch.tensor([nan, 2.0, inf]), both)])[0] == float("inf")
    assert compare([(torch.ones(2), want)])[0] == float("inf")  # a shape that differs


def test_a_half_precision_mismatch_is_judged_against_float32_eager() -> None:
    from scripts.zoo import against_float32

    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 8)).bfloat16()
    x = torch.randn(4, 64).bfloat16()
    with torch.no_grad():
        want = module(x)
        exact = module.float()(x.float())
    module.bfloat16()
    near = exact.bfloat16()  # the float32 result rounded once: nearer to it than eager's bfloat16
    judged = against_float32(module, (x,), near, want, tolerance=1e-6)
    assert judged["status"] == "ok"
    assert judged["float32_error_kiln"] <= judged["float32_error_eager"]
    far = want + want.abs().max() * 0.5  # farther from float32 than eager, and than the tolerance
    judged = against_float32(module, (x,), far, want, tolerance=1e-6)
    assert "status" not in judged
    assert judged["float32_error_kiln"] > judged["float32_error_eager"]


def test_a_nan_output_never_passes_against_float32_where_eager_overflows() -> None:
    from scripts.zoo import against_float32

    module = torch.nn.Linear(4, 4, bias=False).half()
    with torch.no_grad():
        module.weight.fill_(300.0)
    x = torch.full((2, 4), 300.0).half()
    with torch.no_grad():
        want = module(x)  # 360000 overflows float16: eager's error against float32 is infinite
    assert torch.isinf(want).all()
    judged = against_float32(module, (x,), torch.full_like(want, math.nan), want, tolerance=2e-2)
    assert "status" not in judged
