"""What `load()` checks before it trusts a build folder: model.json's files section against the
files there. Sizes are always checked (a truncated model.so would kill the process with SIGBUS
once mapped); digests by default: model.so's xxh3-128 here, on the bytes the loader reads anyway,
and the weights' xxh3-128 in model.so itself (runtime/kiln_verify.h), which also serves C++.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from contract.errors import KilnError
from contract.model_json import FileRecord, ModelJson

MODEL_SO = "model.so"
WEIGHTS = "weights.safetensors"
MODEL_JSON = "model.json"
_RECOMPILE = "recompile the model (kiln compile MODEL) to write the build folder again"
_DIGEST = re.compile(r"[0-9a-f]{32}")


@dataclass(frozen=True)
class BuildManifest:
    path: Path  # model.json
    model: ModelJson

    def file(self, name: str) -> FileRecord:
        listed = self.model.files or {}
        if name not in listed:
            raise KilnError(f"{self.path} lists no {name} (written by an older kiln?)", _RECOMPILE)
        return listed[name]


def read_manifest(build_dir: Path) -> BuildManifest:
    path = build_dir / MODEL_JSON
    try:
        data = json.loads(path.read_bytes())
    except FileNotFoundError:
        raise KilnError(f"{build_dir} has no {MODEL_JSON}", _RECOMPILE) from None
    except (OSError, ValueError) as err:
        raise KilnError(f"{path} is unreadable ({_short(err)})", _RECOMPILE) from None
    if _written_before_xxh3(data):
        raise KilnError(f"{path} was written by an older kiln (its files are listed by sha256)",
                        _RECOMPILE)
    try:
        model = ModelJson.from_json(data)
    except ValueError as err:
        raise KilnError(f"{path} is not a kiln model description ({err})", _RECOMPILE) from None
    return BuildManifest(path, model)


def _written_before_xxh3(data: object) -> bool:
    files = data.get("files") if isinstance(data, dict) else None
    return isinstance(files, dict) and any(isinstance(f, dict) and "sha256" in f for f in files.values())


def check_size(manifest: BuildManifest, path: Path) -> None:
    expected = manifest.file(path.name).bytes
    try:
        size = path.stat().st_size
    except OSError as err:
        raise KilnError(f"cannot read {path}: {err.strerror}", _RECOMPILE) from None
    if size != expected:
        raise KilnError(f"{path} has {size} bytes; {manifest.path.name} records {expected} "
                        "(truncated or replaced)", _RECOMPILE)


def check_digest(manifest: BuildManifest, path: Path, digest: str) -> None:
    """digest (of the bytes read from path) is the one the manifest records."""
    expected = manifest.file(path.name).digest
    if digest != expected:
        raise KilnError(f"{path} does not match the digest {manifest.path.name} records "
                        "(damaged or changed after kiln wrote it)", _RECOMPILE)


def check_weights_header(manifest: BuildManifest, path: Path) -> None:
    """The weights file's own digest (in its header) is the one model.json records: the file is
    the one this build wrote. Its content is checked against that digest by model.so."""
    expected = manifest.file(path.name).xxh3_128
    if weights_digest(path) != expected:
        raise KilnError(f"{path} is not the weights file this build wrote (its digest differs from "
                        f"the one {manifest.path.name} records)", _RECOMPILE)


def weights_digest(path: Path) -> str | None:
    """The xxh3-128 a kiln weights file carries in its safetensors header, or None."""
    try:
        with open(path, "rb") as f:
            length = int.from_bytes(f.read(8), "little")
            if length > 1 << 30:
                return None
            header = json.loads(f.read(length))
    except (OSError, ValueError):
        return None
    meta = header.get("__metadata__") if isinstance(header, dict) else None
    value = meta.get("kiln.xxh3_128") if isinstance(meta, dict) else None
    return value if isinstance(value, str) and _DIGEST.fullmatch(value) else None


def _short(err: BaseException) -> str:
    text = str(err).splitlines()[0] if str(err) else type(err).__name__
    return text[:120]
