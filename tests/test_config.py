"""Config validation: bad fields get short messages that name the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from contract.config import PROJECT_ROOT, load_config
from contract.errors import KilnError

GOOD = """
[model]
factory = "models.mlp:build"

[[inputs]]
name = "x"
shape = [2, 64]
"""


def _load(tmp_path: Path, text: str) -> object:
    path = tmp_path / "m.toml"
    path.write_text(text)
    return load_config(str(path))


def test_every_shipped_config_loads() -> None:
    names = sorted(p.stem for p in (PROJECT_ROOT / "configs").glob("*.toml"))
    for required in ("mlp", "bert", "bert-small", "gpt2", "gpt2-small", "resnet18", "convnet",
                     "cond", "while"):
        assert required in names
    for name in names:
        assert load_config(name).name == name


def test_defaults(tmp_path: Path) -> None:
    config = _load(tmp_path, GOOD)
    assert config.fields["model.dtype"] == "float32"  # type: ignore[attr-defined]
    assert config.fields["weights.seed"] == 0  # type: ignore[attr-defined]
    assert config.fields["tuning.matmul"] == "library"  # type: ignore[attr-defined]
    assert config.fields["lower.layout"] == "traced"  # type: ignore[attr-defined]
    laid = _load(tmp_path, GOOD.replace("[model]", "[lower]\nlayout = \"auto\"\n[model]"))
    assert laid.fields["lower.layout"] == "auto"  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (("factory = \"models.mlp:build\"", "factory = \"models.mlp\""), "module:callable"),
        (("shape = [2, 64]", "shape = [2, 0]"), "positive integers"),
        (("shape = [2, 64]", "shape = [2, 64]\ndtype = \"int64\""), "needs range"),
        (("shape = [2, 64]", "shape = [2, 64]\ncolour = 1"), "unknown key(s) colour"),
        (("[model]", "[modle]\n[model]"), "unknown key(s) modle"),
        (("shape = [2, 64]", "shape = [2, 64]\ndtype = \"complex\""), "dtype must be one of"),
        (("[model]", "[tuning]\nmatmul = \"fast\"\n[model]"), "tuning.matmul must be one of auto, template"),
        (("[model]", "[tuning]\nmatmull = \"auto\"\n[model]"), "unknown key(s) matmull"),
        (("[model]", "[lower]\nlayout = \"nhwc\"\n[model]"), "lower.layout must be one of auto, traced"),
    ],
)
def test_bad_fields(tmp_path: Path, change: tuple[str, str], message: str) -> None:
    with pytest.raises(KilnError) as err:
        _load(tmp_path, GOOD.replace(*change))
    assert message in str(err.value)
