"""The model zoo: real models as users hold them (torchvision, timm, transformers, and a few
hand-written blocks), each compiled with `kiln.compile` and checked against eager.

Usage:
    python scripts/zoo.py [--models a,b | --family tv,seg] [--target cpu|cuda]
                          [--dtype float32|float16|bfloat16] [--full] [--latency]
                          [--jobs N] [--timeout S] [--out DIR]

Each model runs in a process of its own (a native crash or a hang costs that model only), and
prints one JSON line: its status (ok, mismatch, error, crash, timeout, skipped), the first line
of any error, the error relative to eager's largest output and the seconds it took; with
--latency, kiln's and eager's median forward time too. Where eager's outputs say little (each
one value, or NaN), the input of the model's last Linear (its head) is checked too: the model
compiled again with that Linear made an Identity. At the end, a markdown table of every
model and the counts by status. Models whose package is not installed are skipped; the CPU
CI machine has transformers, the GPU machine torchvision and timm too.

Note: a model is built as its package builds it (random init, eval mode) and gets the inputs
its family takes: images (N, 3, 224, 224) or token ids (N, 32). Nothing is wrapped for kiln.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import time
import traceback
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if __package__ in (None, ""):  # run as a file (python scripts/zoo.py): the project root first
    sys.path.insert(0, str(ROOT))
from scripts.isolated import report, run_all, run_case  # noqa: E402

TOLERANCE = {"float32": 2e-3, "float16": 2e-2, "bfloat16": 6e-2}  # of eager's largest |output|

# Used where torchvision cannot say its own list (it is not installed): every classification model
# it has is taken from torchvision.models.list_models where it is (`tv_classification`).
TORCHVISION = [
    "resnet18", "resnet50", "mobilenet_v2", "mobilenet_v3_small", "efficientnet_b0", "regnet_y_400mf",
    "densenet121", "squeezenet1_0", "shufflenet_v2_x0_5", "mnasnet0_5", "googlenet", "vgg11",
    "alexnet", "convnext_tiny", "vit_b_16", "swin_t", "maxvit_t", "wide_resnet50_2", "resnext50_32x4d",
    "efficientnet_v2_s", "regnet_x_400mf",
]
# Segmentation models whole (their output is a dict), and detection models' backbones (the
# detection heads' outputs have data-dependent sizes, which kiln's static shapes cannot hold).
SEGMENTATION = ["fcn_resnet50", "deeplabv3_mobilenet_v3_large", "lraspp_mobilenet_v3_large"]
DETECTION_BACKBONES = ["fasterrcnn_resnet50_fpn", "retinanet_resnet50_fpn", "ssdlite320_mobilenet_v3_large",
                       "fcos_resnet50_fpn"]
TIMM = ["vit_tiny_patch16_224", "vit_small_patch16_224", "convnext_atto", "convnext_tiny", "efficientnet_b0",
        "efficientnet_b2", "resnet18", "resnet50", "deit_tiny_patch16_224", "resnet50d"]
TRANSFORMERS = ["gpt2", "llama", "bert", "t5", "distilbert", "mistral", "opt", "bart", "roberta"]
RESULTS = "results.jsonl"  # in --out: a line per model as it finishes, which --resume reads
BLOCKS = ["bn_block", "conv_bn_relu", "bn_inplace_relu"]


def _torchvision(name: str) -> Any:
    import torchvision

    return torchvision.models.get_model(name, weights=None)


def tv_classification() -> list[str]:
    """Every classification model of the installed torchvision, or the fixed list without it."""
    try:
        import torchvision
    except ModuleNotFoundError:
        return TORCHVISION
    return sorted(torchvision.models.list_models(module=torchvision.models))


def _segmentation(name: str) -> Any:
    import torchvision

    return torchvision.models.get_model(name, weights=None, weights_backbone=None)


def _detection_backbone(name: str) -> Any:
    import torchvision

    return torchvision.models.get_model(name, weights=None, weights_backbone=None).backbone


def _timm(name: str) -> Any:
    import timm  # type: ignore[import-not-found, unused-ignore]

    return timm.create_model(name, pretrained=False)


# Tiny configs keep the CPU run short; on the GPU the default configs are used (--full).
_HF_TINY = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128,
            "n_embd": 64, "n_layer": 2, "n_head": 4, "d_model": 64, "num_layers": 2, "num_heads": 4,
            "d_ff": 128, "encoder_layers": 2, "decoder_layers": 2, "encoder_attention_heads": 4,
            "decoder_attention_heads": 4, "encoder_ffn_dim": 128, "decoder_ffn_dim": 128, "ffn_dim": 128,
            "dim": 64, "n_heads": 4, "hidden_dim": 128, "num_key_value_heads": 2, "word_embed_proj_dim": 64}
_HF = {"gpt2": ("GPT2Config", "GPT2LMHeadModel"), "llama": ("LlamaConfig", "LlamaForCausalLM"),
       "bert": ("BertConfig", "BertModel"), "t5": ("T5Config", "T5ForConditionalGeneration"),
       "distilbert": ("DistilBertConfig", "DistilBertModel"),
       "mistral": ("MistralConfig", "MistralForCausalLM"),
       "opt": ("OPTConfig", "OPTForCausalLM"), "bart": ("BartConfig", "BartForConditionalGeneration"),
       "roberta": ("RobertaConfig", "RobertaModel")}


def _transformers(name: str, full: bool) -> Any:
    import transformers

    config_name, model_name = _HF[name]
    config_class = getattr(transformers, config_name)
    config = config_class()
    if not full:
        for key, value in _HF_TINY.items():
            if hasattr(config, key):
                setattr(config, key, value)
        if hasattr(config, "vocab_size"):
            config.vocab_size = 1000
    config.tie_word_embeddings = getattr(config, "tie_word_embeddings", True)
    return getattr(transformers, model_name)(config)


def _block(name: str) -> Any:
    from torch import nn

    blocks: dict[str, Callable[[], Any]] = {
        "bn_block": lambda: nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10)),
        "conv_bn_relu": lambda: nn.Sequential(nn.Conv2d(3, 16, 3, stride=2), nn.BatchNorm2d(16), nn.ReLU6(),
                                              nn.Conv2d(16, 16, 1), nn.BatchNorm2d(16), nn.Hardswish()),
        "bn_inplace_relu": lambda: nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(inplace=True),
                                                 nn.MaxPool2d(2), nn.BatchNorm2d(8, affine=False)),
        "zero_head": lambda: _zero_head(nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                                                      nn.Flatten(), nn.Linear(8, 10))),
    }
    return blocks[name]()


def _zero_head(module: Any) -> Any:
    """module with its last layer's weight and bias zero, as torchvision initializes ViT's head."""
    import torch

    with torch.no_grad():
        module[-1].weight.zero_()
        module[-1].bias.zero_()
    return module


def family_of(model: str) -> str:
    return model.split(":", 1)[0]


def interleaved(models: list[str]) -> list[str]:
    """The models round-robin over their kinds (resnet, vgg, vit...): the first of each kind,
    then the second of each, and so on.

    Note: members of a kind share many kernels at the zoo's one input size (resnet101 has
    resnet50's blocks). Run side by side, each would tune them afresh; run one round later, the
    second finds them in the shared cache. So this order costs the least tuning for a zoo.
    """
    kinds: dict[str, list[str]] = {}
    for model in sorted(models, key=_natural):
        kind = re.sub(r"[^a-z].*$", "", model.split(":", 1)[-1])  # resnet101 -> resnet
        kinds.setdefault(f"{family_of(model)}:{kind}", []).append(model)
    rounds = max((len(members) for members in kinds.values()), default=0)
    return [members[i] for i in range(rounds) for members in kinds.values() if i < len(members)]


def _natural(model: str) -> list[Any]:
    """resnet18 before resnet101: digits compared as numbers."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", model)]


def every_model() -> list[str]:
    return ([f"tv:{m}" for m in tv_classification()] + [f"seg:{m}" for m in SEGMENTATION]
            + [f"det:{m}" for m in DETECTION_BACKBONES] + [f"timm:{m}" for m in TIMM]
            + [f"hf:{m}" for m in TRANSFORMERS] + [f"block:{m}" for m in BLOCKS])


def build(model: str, full: bool) -> tuple[Any, Callable[[int], tuple[Any, ...]]]:
    """The module, and a function of the batch size giving its example inputs."""
    import torch

    family, name = model.split(":", 1)
    makers: dict[str, Callable[[], Any]] = {
        "tv": lambda: _torchvision(name), "seg": lambda: _segmentation(name),
        "det": lambda: _detection_backbone(name), "timm": lambda: _timm(name),
        "hf": lambda: _transformers(name, full), "block": lambda: _block(name)}
    module = makers[family]()
    if family == "hf":
        vocab = min(getattr(module.config, "vocab_size", 1000), 1000)
        if getattr(module.config, "is_encoder_decoder", False):  # ids, attention mask, decoder ids
            return module, lambda n: (torch.randint(0, vocab, (n, 32)), torch.ones(n, 32, dtype=torch.long),
                                      torch.randint(0, vocab, (n, 16)))
        return module, lambda n: (torch.randint(0, vocab, (n, 32)),)
    size = {"block": 64, "det": 320}.get(family, 224)
    return module, lambda n: (torch.randn(n, 3, size, size),)


def run_one(model: str, target: str, dtype_name: str, full: bool, cache: Path, out: Path,
            latency: bool = False) -> dict[str, Any]:
    import torch
    from torch.utils import _pytree as pytree

    import kiln

    torch.manual_seed(0)
    dtype = getattr(torch, dtype_name)
    device = "cuda" if target == "cuda" else "cpu"
    module, inputs_for = build(model, full)
    module = module.eval().to(device)
    calibrated = calibrate_norms(module, lambda: tuple(t.to(device) for t in inputs_for(CALIBRATION_BATCH)))
    inputs = tuple(t.to(device) for t in inputs_for(2))
    if dtype != torch.float32:
        module = module.to(dtype)
        inputs = tuple(t.to(dtype) if t.is_floating_point() else t for t in inputs)
    with torch.no_grad():
        want = module(*inputs)
    compiled = kiln.compile(module, inputs, target=target, out=out, cache_dir=cache)
    profile = compile_profile(out)
    got = compiled(*inputs)
    if type(got) is not type(want):
        return {"status": "mismatch", "error": f"returns {type(got).__name__}, eager {type(want).__name__}"} \
            | profile
    pairs = list(zip(pytree.tree_leaves(got), pytree.tree_leaves(want), strict=False))
    relative, nonfinite = compare(pairs)
    status = "ok" if relative <= TOLERANCE[dtype_name] else "mismatch"
    found = {"status": status, "relative_error": relative, "outputs": len(pairs),
             "calibrated_norms": calibrated} | profile
    if nonfinite:
        found["error"] = f"eager gives {nonfinite} NaN/inf values; kiln must match them in place"
    elif constant(pairs):
        found["error"] = "eager's outputs are each one value (a zero-initialized head?): a weak check"
    if latency:
        with torch.no_grad():
            found |= milliseconds({"kiln": lambda: compiled(*inputs), "eager": lambda: module(*inputs)},
                                  device)
    if "error" in found:  # the outputs say little: check what the head reads
        found |= judged_below_head(below_head(module, inputs, target, cache, out), dtype_name, found)
    # (where the head's input was judged, the outputs said little: they are not judged again)
    if found["status"] == "mismatch" and dtype != torch.float32 and "head_input_error" not in found:
        judged = against_float32(module, inputs, got, want, TOLERANCE[dtype_name])
        if "error" in found and "error" in judged:
            judged["error"] = f"{found['error']}; {judged['error']}"
        found |= judged
    return found


def against_float32(module: Any, inputs: tuple[Any, ...], got: Any, want: Any,
                    tolerance: float) -> dict[str, Any]:
    """Where kiln's half-precision outputs are farther from eager's than the tolerance: both,
    each against eager in float32 (the same weights and inputs, upcast), the result the two
    approximate. kiln passes when it is no farther from it than eager's own half-precision run
    (or within the tolerance of it): eager's rounding is then not a reference kiln can be judged by.

    Note: a deep model in float16 can drift from itself by more than the tolerance: in
    regnet_y_128gf, eager and kiln differed by 3.6e-2 of the largest output. An output kiln
    makes non-finite where float32's is finite never passes (eager's error may be infinite)."""
    import copy

    import torch
    from torch.utils import _pytree as pytree

    reference = copy.deepcopy(module).float()
    # full float32: cuDNN's convolutions use TF32 by default, whose mantissa is float16's
    with torch.no_grad(), torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        exact = pytree.tree_leaves(reference(*(t.float() if t.is_floating_point() else t for t in inputs)))
    del reference
    kiln_error, _ = compare(list(zip(pytree.tree_leaves(got), exact, strict=False)))
    eager_error, _ = compare(list(zip(pytree.tree_leaves(want), exact, strict=False)))
    found: dict[str, Any] = {"float32_error_kiln": kiln_error, "float32_error_eager": eager_error}
    if math.isfinite(kiln_error) and kiln_error <= max(eager_error, tolerance):
        found["status"] = "ok"
        found["error"] = (f"kiln and eager differ by more than the tolerance, but against float32 eager "
                          f"kiln's error is {kiln_error:.2e} and eager's {eager_error:.2e}")
    return found


CALIBRATION_BATCH = 8  # inputs of the one forward that measures the BatchNorms' statistics


def calibrate_norms(module: Any, make_inputs: Callable[[], tuple[Any, ...]]) -> int:
    """Give every BatchNorm that tracks statistics the running mean and variance of its input
    on make_inputs()'s (one forward without grad, before any dtype conversion, with only the
    BatchNorms in train mode), as a trained model's are. The count of them; the inputs are made
    only where there is one, so other models' inputs are what they were.

    Note: the zoo's models have random weights (no network to fetch trained ones), and eval's
    BatchNorm then runs on its initial statistics (mean 0, variance 1): it normalizes nothing.
    Deep nets so built give fp16 activations that overflow to NaN (resnet152, inception_v3) or
    collapse to one value (mobilenet_v3, efficientnet), and a match with such an eager output
    says little. A user's trained model has statistics that fit its data, which this gives.
    The rest of the model stays in eval mode: no dropout, no train-only branch.
    """
    import torch

    norms = [m for m in module.modules()
             if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.track_running_stats]
    if not norms:
        return 0
    momenta = [m.momentum for m in norms]
    for norm in norms:
        norm.reset_running_stats()
        norm.momentum = None  # a cumulative average: after one batch, that batch's statistics
        norm.train()
    try:
        with torch.no_grad():
            module(*make_inputs())
    finally:
        for norm, momentum in zip(norms, momenta, strict=True):
            norm.momentum = momentum
            norm.eval()
    return len(norms)


def below_head(module: Any, inputs: tuple[Any, ...], target: str, cache: Path, out: Path) -> dict[str, Any]:
    """The zoo's check on the input of the module's last Linear (its classifier head), the module
    then compiled again with that Linear made an Identity; {} where it has no Linear.

    Note: a head zero-initialized (torchvision's ViT) or fed activations that fp16 collapsed gives
    logits of one value, which any program that keeps the shapes matches."""
    import torch
    from torch.utils import _pytree as pytree

    import kiln

    linears = [name for name, sub in module.named_modules() if isinstance(sub, torch.nn.Linear)]
    if not linears:
        return {}
    parent, _, attr = linears[-1].rpartition(".")
    setattr(module.get_submodule(parent), attr, torch.nn.Identity())
    try:
        with torch.no_grad():
            want = module(*inputs)
        got = kiln.compile(module, inputs, target=target, out=out.with_name(f"{out.name}-head-input"),
                           cache_dir=cache)(*inputs)
    except Exception as err:
        return {"head_input": f"not checked: {type(err).__name__}: {str(err)[:120]}"}
    pairs = list(zip(pytree.tree_leaves(got), pytree.tree_leaves(want), strict=False))
    relative, nonfinite = compare(pairs)
    return {"head_input_error": relative, "head_input_says_little": bool(nonfinite) or constant(pairs)}


def _head_input_cell(row: dict[str, Any]) -> str:
    """The table's "head input" cell: the error below a head whose outputs said little."""
    if "head_input_error" not in row:
        return str(row.get("head_input", ""))[:40]
    return f"{row['head_input_error']:.2e}" + (" (weak too)" if row["head_input_says_little"] else "")


def judged_below_head(below: dict[str, Any], dtype_name: str, found: dict[str, Any]) -> dict[str, Any]:
    """found's status and note, with the check below the head."""
    if "head_input_error" not in below:
        return below
    error = below["head_input_error"]
    status = found["status"] if error <= TOLERANCE[dtype_name] else "mismatch"
    says = "says little too" if below["head_input_says_little"] else "is informative"
    note = f"{found['error']}; the head's input ({says}): error {error:.2e}"
    return below | {"status": status, "error": note}


def compare(pairs: list[tuple[Any, Any]]) -> tuple[float, int]:
    """The largest error of kiln's outputs relative to eager's largest finite |output|, and how
    many of eager's values are NaN or infinite.

    Note: a NaN in either output must count, never vanish: max(0.0, nan) is 0.0 in Python, so a
    model whose outputs were all NaN once read as an exact match. Non-finite values must agree
    in place (NaN with NaN, +inf with +inf); any other disagreement is an infinite error.
    """
    import torch

    worst, scale, nonfinite = 0.0, 1.0, 0
    for a, b in pairs:
        if not isinstance(b, torch.Tensor) or not b.numel():
            continue
        if not isinstance(a, torch.Tensor) or a.shape != b.shape:
            return math.inf, nonfinite
        x, y = a.detach().double().cpu(), b.detach().double().cpu()
        finite = torch.isfinite(y)
        nonfinite += int((~finite).sum())
        same_nonfinite = (torch.isnan(x) & torch.isnan(y)) | (x == y)
        if bool((~finite & ~same_nonfinite).any()) or bool((finite & ~torch.isfinite(x)).any()):
            return math.inf, nonfinite
        if bool(finite.any()):
            worst = max(worst, float((x - y).abs()[finite].max()))
            scale = max(scale, float(y.abs()[finite].max()))
    return worst / scale, nonfinite


def constant(pairs: list[tuple[Any, Any]]) -> bool:
    """Whether every output of eager's holds a single value, as a zero-initialized classifier
    head gives: a match then says little about the layers below it."""
    import torch

    tensors = [b for _, b in pairs if isinstance(b, torch.Tensor) and b.numel() > 1]
    return bool(tensors) and all(bool((t == t.reshape(-1)[0]).all()) for t in tensors)


def compile_profile(out: Path) -> dict[str, Any]:
    """From the build's report.json: the compile's seconds, each stage's, and its kernel and
    fallback counts (where a model's compile time goes, for the table)."""
    try:
        report_data = json.loads((out / "report.json").read_text())
    except (OSError, ValueError):
        return {}
    return {"compile_s": round(float(report_data["seconds"]), 1),
            "stages_s": {row["stage"]: round(float(row["seconds"]), 1) for row in report_data["stages"]},
            "kernels": len(report_data.get("kernels", [])),
            "fallback_calls": sum(report_data.get("fallbacks", {}).values())}


def milliseconds(calls: dict[str, Callable[[], Any]], device: str, runs: int = 20) -> dict[str, float]:
    """The median time of one call of each, after warm-up; a GPU is synchronized around each call.

    Note: the calls take turns, run by run, so a load that comes and goes (other models compiling
    on the same machine) weighs on each alike and their ratio stays fair."""
    import statistics

    import torch

    def sync() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    for call in calls.values():
        for _ in range(3):
            call()
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(runs):
        for name, call in calls.items():
            sync()
            started = time.perf_counter()
            call()
            sync()
            times[name].append(time.perf_counter() - started)
    return {f"{name}_ms": round(1000 * statistics.median(t), 3) for name, t in times.items()}


def _child(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    try:
        found = run_one(args.child, args.target, args.dtype, args.full, Path(args.cache),
                        Path(args.out) / "builds" / args.child.replace(":", "_"), args.latency)
    except ModuleNotFoundError as err:
        found = {"status": "skipped", "error": str(err)}
    except Exception as err:  # the model's failure is the finding
        traceback.print_exc()
        found = {"status": "error", "error": f"{type(err).__name__}: {str(err).strip().splitlines()[0][:300]}"
                 if str(err).strip() else type(err).__name__}
    found["seconds"] = round(time.perf_counter() - started, 1)
    report(found)
    return 0


def _spawn(model: str, args: argparse.Namespace) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", model, "--target", args.target, "--dtype", args.dtype,
           "--cache", str(args.out / "cache"), "--out", str(args.out)] + (["--full"] if args.full else []) \
        + (["--latency"] if args.latency else [])
    started = time.perf_counter()
    found = run_case(cmd, ROOT, args.out / "logs" / f"{model.replace(':', '_')}.log", args.timeout)
    if found["status"] == "crash":
        found = {"status": "crash", "error": f"exit {found['exit']}"}
    found.setdefault("seconds", round(time.perf_counter() - started, 1))
    return {"model": model} | found


def _earlier_results(path: Path) -> dict[str, dict[str, Any]]:
    """Each model's last result in a results file (a line per finished model); a line cut short
    by a killed run, a model an earlier deadline left unrun, and a weak check from before the
    head's input was checked (below_head) or the BatchNorms calibrated are skipped, so that
    model runs."""
    found: dict[str, dict[str, Any]] = {}
    lines = path.read_text().splitlines() if path.is_file() else []
    for line in lines:
        try:
            result = json.loads(line)
        except ValueError:
            continue
        if result.get("status") != "not run" and not _weak_unchecked(result):
            found[result["model"]] = result
    return found


def _weak_unchecked(result: dict[str, Any]) -> bool:
    """An ok row whose outputs said little, from before the head's input was checked, or whose
    head's input said little too before BatchNorms were calibrated (calibrate_norms): run again,
    it may say more."""
    said = str(result.get("error", ""))
    weak = result.get("status") == "ok" and ("a weak check" in said or "NaN/inf values" in said)
    informative = "head_input_error" in result and not result.get("head_input_says_little")
    return weak and not informative and "calibrated_norms" not in result


def table(results: list[dict[str, Any]]) -> str:
    """A markdown table: model, status, error relative to eager (and below the head, where the
    outputs said little), kiln's and eager's latency."""
    rows = ["| model | status | max error (rel.) | head input | kiln ms | eager ms | compile s | note |",
            "|---|---|---|---|---|---|---|---|"]
    for r in results:
        error = f"{r['relative_error']:.2e}" if "relative_error" in r else ""
        head = _head_input_cell(r)
        times = f"{r.get('kiln_ms', '')} | {r.get('eager_ms', '')} | {r.get('compile_s', '')}"
        note = r.get("error", "")[:90]
        rows.append(f"| {r['model']} | {r['status']} | {error} | {head} | {times} | {note} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", help="comma-separated, e.g. tv:resnet18,hf:gpt2 (default: every model)")
    p.add_argument("--family", help="only these families, comma-separated: tv, seg, det, timm, hf, block")
    p.add_argument("--target", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--dtype", default="float32", choices=sorted(TOLERANCE))
    p.add_argument("--full", action="store_true", help="transformers' default configs, not tiny ones")
    p.add_argument("--latency", action="store_true", help="time kiln's and eager's forward too (median ms)")
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--timeout", type=int, default=600, help="seconds per model")
    p.add_argument("--exclude", default="", help="comma-separated models to leave out (run in another call)")
    p.add_argument("--shard", help="i/n: every n-th model from the i-th (0-based), to split a run over calls")
    p.add_argument("--deadline", type=float,
                   help="seconds: start no model after this; those not started are reported 'not run'")
    p.add_argument("--out", type=Path, default=ROOT / "build" / "zoo")
    p.add_argument("--resume", action="store_true",
                   help=f"take models already in OUT/{RESULTS} from there (an earlier call's); run the rest")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--cache", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return _child(args)
    models = args.models.split(",") if args.models else every_model()
    if args.family:
        models = [m for m in models if family_of(m) in args.family.split(",")]
    excluded = set(args.exclude.split(","))
    models = interleaved([m for m in models if m not in excluded])
    if args.shard:
        index, count = (int(part) for part in args.shard.split("/"))
        models = models[index::count]
    (args.out / "logs").mkdir(parents=True, exist_ok=True)
    stop_at = time.monotonic() + args.deadline if args.deadline else None
    done = _earlier_results(args.out / RESULTS) if args.resume else {}

    def spawn(model: str) -> dict[str, Any]:
        if model in done:
            return done[model]
        if stop_at is not None and time.monotonic() > stop_at:
            return {"model": model, "status": "not run", "error": "--deadline passed before it started"}
        found = _spawn(model, args)
        with (args.out / RESULTS).open("a") as results:
            results.write(json.dumps(found) + "\n")
        return found

    results = run_all(models, spawn, args.jobs)
    (args.out / "zoo.json").write_text(json.dumps(results, indent=1))
    print(table(results))
    counts = Counter(r["status"] for r in results)
    print("zoo:", ", ".join(f"{n} {status}" for status, n in counts.most_common()), f"of {len(results)}")
    return 0 if not counts.keys() - {"ok", "skipped"} else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
