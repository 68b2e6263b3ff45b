"""The weights stage: trace exports a module built without weights, and the weights file is made
apart, from a checkpoint or the seeded init (issue: the dev loop in seconds)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest
import torch

from contract.config import load_config
from contract.errors import KilnError
from pipeline.build import Cache, compile_model
from pipeline.runner import BuildOptions, BuildResult
from pipeline.stages import STAGES
from tests.fake_stages import with_consumer

# Every source a program's tensor can have: parameters (two tied), a persistent int buffer, a
# non-persistent buffer, a tensor attribute, and a constant the forward makes.
ODD_MODEL = '''
import torch


class Shift(torch.nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.register_buffer("step", torch.linspace(-1, 1, width), persistent=False)

    def forward(self, x):
        return x + self.step


class Odd(torch.nn.Module):
    def __init__(self, width: int, reads_a_value: bool = False) -> None:
        super().__init__()
        self.emb = torch.nn.Linear(8, width)
        self.out = torch.nn.Linear(width, width)
        self.again = torch.nn.Linear(width, width, bias=False)
        self.again.weight = self.out.weight
        self.register_buffer("offset", torch.arange(width, dtype=torch.float32) / width, persistent=False)
        self.register_buffer("count", torch.tensor(3))
        self.scale = torch.linspace(0.5, 1.5, width)
        self.first = Shift(width)
        self.second = self.first  # one module (and its buffer) under two names
        if reads_a_value:  # an __init__ that reads a tensor's value cannot run on the meta device
            self.depth = int(torch.rand(()).item() * 0) + 1

    def forward(self, x):
        h = (self.emb(x) + self.offset) * self.scale + self.count
        h = self.out(self.first(h)) + self.again(self.second(h))
        return h + torch.tensor([1.0, -1.0]).repeat(h.shape[-1] // 2)


def build(width: int = 6, reads_a_value: bool = False) -> Odd:
    return Odd(width, reads_a_value)
'''

CONFIG = """
[model]
factory = "oddmodel:build"
kwargs = {{ width = 6, reads_a_value = {reads} }}

[[inputs]]
name = "x"
shape = [4, 8]
dtype = "float32"

[weights]
seed = {seed}
{extra}
"""


@pytest.fixture
def odd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    root = tmp_path / "proj"
    (root / "configs").mkdir(parents=True)
    (root / "oddmodel.py").write_text(ODD_MODEL)
    monkeypatch.syspath_prepend(str(root))  # in process: the worker would put it there
    yield _config(root)
    sys.modules.pop("oddmodel", None)


def _config(root: Path, seed: int = 0, extra: str = "", reads: bool = False) -> Path:
    path = root / "configs" / "odd.toml"
    path.write_text(CONFIG.format(seed=seed, extra=extra, reads=str(reads).lower()))
    return path


def _compile(config_path: Path, cache: Cache, out: Path, stages: tuple = STAGES) -> BuildResult:  # type: ignore[type-arg]
    config = load_config(str(config_path))
    return compile_model(config, BuildOptions("cpu", out, in_process=True), cache, stages=stages)


def _eager(root: Path, seed: int, **kwargs: object) -> torch.nn.Module:
    sys.modules.pop("oddmodel", None)
    sys.path.insert(0, str(root))
    try:
        import oddmodel  # type: ignore[import-not-found]

        torch.manual_seed(seed)
        return oddmodel.build(**kwargs).eval()  # type: ignore[no-any-return]
    finally:
        sys.path.remove(str(root))
        sys.modules.pop("oddmodel", None)


def _status(result: BuildResult) -> dict[str, str]:
    return {row.stage: row.status for row in result.rows}


def test_the_program_is_the_same_with_and_without_weights(odd: Path) -> None:
    from tasks.trace.export import decompose, export_only, program_json
    from tasks.trace.fake import build_fake, fake_inputs

    config = {"model.factory": "oddmodel:build", "model.kwargs": {"width": 6}, "model.dtype": "float32",
              "weights.seed": 0}
    x = (torch.randn(4, 8),)
    root = odd.parent.parent
    real = program_json(decompose(export_only(_eager(root, 0), x, "odd", root), "odd", root))
    fake, mode = build_fake(config, "odd", root)
    assert not any(t.device.type == "meta" for t in fake.state_dict().values())
    without = program_json(decompose(export_only(fake, fake_inputs(mode, x), "odd", root), "odd", root))
    assert without == real


def test_weights_of_every_source_match_eager(odd: Path, cache: Cache, tmp_path: Path) -> None:
    from kiln import load

    result = _compile(odd, cache, tmp_path / "out")
    assert "built" not in result.entries["trace"].meta["notes"]  # built without weights
    x = torch.randn(4, 8)
    with torch.no_grad():
        torch.testing.assert_close(load(tmp_path / "out")(x), _eager(odd.parent.parent, 0)(x))


def _save_checkpoint(root: Path, seed: int, path: Path) -> dict[str, torch.Tensor]:
    state = _eager(root, seed).state_dict()
    torch.save(state, path)
    return state


def test_a_new_checkpoint_runs_the_weights_stage_alone(odd: Path, cache: Cache, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    root = odd.parent.parent
    stages = with_consumer(STAGES)
    _compile(odd, cache, tmp_path / "seeded", stages)  # the seeded init's buffers become an item
    ckpt = root / "ckpt.pt"
    _config(root, extra='checkpoint = "../ckpt.pt"')
    for seed in (1, 2):
        state = _save_checkpoint(root, seed, ckpt)
        result = _compile(odd, cache, tmp_path / f"ckpt{seed}", stages)
        assert _status(result) == {"trace": "hit", "weights": "ran", "consume": "hit"}
        # the init's buffers came from their item: the model was not built
        assert result.entries["weights"].meta["notes"]["summary"] == "checkpoint ckpt.pt"
        weights = load_file(str(result.out / "weights.safetensors"))
        assert torch.equal(weights["emb.weight"], state["emb.weight"])
        assert torch.equal(weights["offset"], torch.arange(6) / 6)
        # tied: eager's load_state_dict leaves the last name's values in the one parameter
        assert torch.equal(weights["out.weight"], state["again.weight"])


def test_a_checkpoint_with_tied_names_that_differ_loads_as_eager_does(odd: Path, cache: Cache,
                                                                       tmp_path: Path) -> None:
    from kiln import load

    root = odd.parent.parent
    state = {k: v.clone() for k, v in _eager(root, 1).state_dict().items()}
    state["out.weight"], state["again.weight"] = torch.zeros(6, 6), torch.randn(6, 6)
    torch.save(state, root / "ckpt.pt")
    _config(root, extra='checkpoint = "../ckpt.pt"')
    _compile(odd, cache, tmp_path / "out")
    eager = _eager(root, 0)
    eager.load_state_dict(state)
    x = torch.randn(4, 8)
    with torch.no_grad():
        torch.testing.assert_close(load(tmp_path / "out")(x), eager(x))


def test_a_checkpoint_that_does_not_match_names_the_tensors(odd: Path, cache: Cache, tmp_path: Path) -> None:
    root = odd.parent.parent
    state = _eager(root, 1).state_dict()
    state["emb.weight"] = torch.zeros(5, 8)
    state["count"] = torch.tensor(3.0)  # a float where the model has an int
    del state["out.bias"]
    torch.save(state, root / "bad.pt")
    _config(root, extra='checkpoint = "../bad.pt"')
    with pytest.raises(KilnError) as raised:
        _compile(odd, cache, tmp_path / "out", with_consumer(STAGES))
    message = str(raised.value)
    assert "missing 1: out.bias" in message
    assert "shape emb.weight: checkpoint (5, 8), model (6, 8)" in message
    assert "dtype count: checkpoint float32, model int64" in message


def test_a_model_that_needs_its_values_to_build_is_built_for_real(odd: Path, cache: Cache,
                                                                   tmp_path: Path) -> None:
    from kiln import load

    root = odd.parent.parent
    _config(root, reads=True)
    result = _compile(odd, cache, tmp_path / "out")
    assert result.entries["trace"].meta["notes"]["built"].startswith("for real")
    x = torch.randn(4, 8)
    with torch.no_grad():
        torch.testing.assert_close(load(tmp_path / "out")(x), _eager(root, 0, reads_a_value=True)(x))


@pytest.mark.parametrize("name", ["bert-small", "gpt2-small"])
def test_a_transformers_program_is_the_same_with_and_without_weights(name: str) -> None:
    pytest.importorskip("transformers")
    from tasks.trace.export import decompose, export_only, program_json
    from tasks.trace.factory import build_model, example_inputs
    from tasks.trace.fake import build_fake, fake_inputs

    config = load_config(name)
    fields = {k: config.job_value(k) for k in ("model.factory", "model.kwargs", "model.dtype", "inputs",
                                               "weights.seed")}
    root, x = config.project_root, example_inputs(fields["inputs"], 0)
    real = program_json(decompose(export_only(build_model(fields, name, root), x, name, root), name, root))
    fake, mode = build_fake(fields, name, root)
    assert program_json(decompose(export_only(fake, fake_inputs(mode, x), name, root), name, root)) == real


def test_explain_after_a_checkpoint_swap_says_only_the_weights_change(odd: Path, tmp_path: Path) -> None:
    from tests.conftest import kiln

    root = odd.parent.parent
    _config(root, extra='checkpoint = "../ckpt.pt"')
    _save_checkpoint(root, 1, root / "ckpt.pt")
    config = str(odd)
    kiln(["compile", config, "--target", "cpu", "--quiet"], tmp_path / "c")
    assert "nothing changed" in kiln(["explain", config, "--target", "cpu"], tmp_path / "c").stdout
    _save_checkpoint(root, 2, root / "ckpt.pt")
    explained = kiln(["explain", config, "--target", "cpu"], tmp_path / "c").stdout
    assert "part checkpoint changed" in explained
    assert "weights changed; program unchanged" in explained


def test_the_weights_file_is_safetensors_that_torch_reads_back(tmp_path: Path) -> None:
    from safetensors import safe_open
    from safetensors.torch import load_file

    from tasks.weights.files import DIGEST_KEY, write_weights

    w = torch.randn(4, 6)
    tensors = {"a": w, "tied": w, "t": torch.randn(5, 3).t(), "h": torch.randn(3).half(),
               "b": torch.randn(2, 2).bfloat16(), "zero_d": torch.tensor(3), "empty": torch.zeros(0, 4),
               "flags": torch.tensor([True, False]), "i8": torch.tensor([1, -2], dtype=torch.int8)}
    path = tmp_path / "w.safetensors"
    write_weights(tensors, path)
    back = load_file(str(path))
    assert back.keys() == tensors.keys()
    for name, t in tensors.items():
        assert back[name].dtype == t.dtype, name
        assert torch.equal(back[name], t), name
    with safe_open(str(path), "pt") as f:
        assert len(f.metadata()[DIGEST_KEY]) == 32


def test_a_config_elsewhere_names_its_project(odd: Path, tmp_path: Path) -> None:
    """A copy of a config kept elsewhere (as `kiln bench` writes its edits) has the project it
    names, so its model is imported, and its trace keyed, as its original's."""
    root = odd.parent.parent
    elsewhere = tmp_path / "elsewhere" / "odd-copy.toml"
    elsewhere.parent.mkdir()
    elsewhere.write_text(odd.read_text().replace("[model]", f'[model]\nproject = "{root}"'))
    assert load_config(str(elsewhere)).project_root == root.resolve()
    elsewhere.write_text(odd.read_text().replace("[model]", '[model]\nproject = "nowhere"'))
    with pytest.raises(KilnError, match=r"model\.project must name a folder"):
        load_config(str(elsewhere))


def test_the_report_says_where_trace_spent_its_seconds(odd: Path, cache: Cache, tmp_path: Path) -> None:
    from pipeline.report import report_json

    result = _compile(odd, cache, tmp_path / "out", with_consumer(STAGES))
    trace = report_json(result)["stages"][0]
    names = [name for name, _ in trace["parts"]]
    assert names == ["stage imports", "model imports", "construction", "export", "decompositions",
                     "serialization", "worker start, commit"]
    assert sum(seconds for _, seconds in trace["parts"]) == pytest.approx(trace["seconds"], abs=0.01)


def _spillable_model() -> torch.nn.Sequential:
    """Tensors of every kind a build makes at ≥ 1 MiB: tied parameters, a buffer, an in-place
    init after construction, a conversion of the whole module; and tensors the spill leaves
    alone (one that requires grad, a sparse one)."""
    torch.manual_seed(3)
    embedding, linear = torch.nn.Embedding(4096, 256), torch.nn.Linear(256, 4096)
    linear.weight = embedding.weight
    torch.nn.init.normal_(embedding.weight, std=0.02)
    model = torch.nn.Sequential(embedding, linear)
    model.register_buffer("mask", torch.ones(1024, 1024).tril(), persistent=False)
    model.leaf = torch.randn(512, 512, requires_grad=True)
    model.sparse = torch.eye(1024).to_sparse()
    return model.to(torch.float16)


def test_a_spilled_build_makes_the_values_a_plain_build_makes(tmp_path: Path) -> None:
    from tasks.weights.spill import Spill

    plain = _spillable_model()
    spill = Spill(tmp_path)
    with spill.building():
        spilled = _spillable_model()
    if spill.on:  # not where the tests' folder is in memory (tmpfs), where the spill is off
        assert spill.spilled_bytes >= 2 * 4096 * 256 * 2 + 1024 * 1024 * 2  # the fp16 copies at least
    assert not list(tmp_path.iterdir())  # the scratch files are unlinked once mapped
    want = {**plain.state_dict(), "mask": plain.get_buffer("mask")}
    got = {**spilled.state_dict(), "mask": spilled.get_buffer("mask")}
    for name, tensor in got.items():
        spill.release(tensor)  # its pages come back from the page cache, unchanged
        assert tensor.dtype == want[name].dtype, name
        assert torch.equal(tensor, want[name]), name
    assert spilled.get_submodule("1").weight is spilled.get_submodule("0").weight
    leaf, sparse = cast(torch.Tensor, spilled.leaf), cast(torch.Tensor, spilled.sparse)
    assert leaf.is_leaf  # untouched, as eager makes it
    assert leaf.requires_grad
    assert torch.equal(sparse.to_dense(), cast(torch.Tensor, plain.sparse).to_dense())


def test_the_spill_is_off_where_its_folder_is_in_memory() -> None:
    from tasks.weights.spill import Spill, _filesystem

    assert _filesystem(Path("/proc/self")) == "proc"
    shm = Path("/dev/shm")
    if _filesystem(shm) != "tmpfs":
        pytest.skip("no tmpfs at /dev/shm here")
    assert not Spill(shm).on
