"""model.json, typed: what a build folder says about its model, written by gen-cpp (the tensors
and the output structure), completed by the engine when it publishes the folder (the files
section), and read by load() before it trusts the folder.

The JSON is canonical (pretty_json sorts keys), so from_json(to_json()) is the same bytes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: str

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "shape": list(self.shape), "stride": list(self.stride),
                "dtype": self.dtype}

    @classmethod
    def from_json(cls, data: Any) -> TensorSpec:
        record = _object(data, "a tensor")
        return cls(_str(record, "name"), _ints(record, "shape"), _ints(record, "stride"),
                   _str(record, "dtype"))


@dataclass(frozen=True)
class FileRecord:
    """A published file: its size, its digest (cache.hashing.digest_file: the file's xxh3-128),
    and for the weights their xxh3_128 (the digest the weights file carries in its own header,
    which model.so checks)."""

    bytes: int
    digest: str
    xxh3_128: str | None = None

    def to_json(self) -> dict[str, Any]:
        found: dict[str, Any] = {"bytes": self.bytes, "digest": self.digest}
        if self.xxh3_128 is not None:
            found["xxh3_128"] = self.xxh3_128
        return found

    @classmethod
    def from_json(cls, data: Any) -> FileRecord:
        record = _object(data, "a file record")
        size, xxh3 = record.get("bytes"), record.get("xxh3_128")
        if not isinstance(size, int) or (xxh3 is not None and not isinstance(xxh3, str)):
            raise ValueError("a file record needs an integer bytes and a string xxh3_128")
        return cls(size, _str(record, "digest"), xxh3)


@dataclass(frozen=True)
class ModelJson:
    target: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    in_spec: Any  # torch's pytree spec of the inputs, serialized (None: a flat tuple)
    out_spec: Any  # ... of the outputs
    files: Mapping[str, FileRecord] | None = None  # None until the build folder is published

    def to_json(self) -> dict[str, Any]:
        found: dict[str, Any] = {"target": self.target, "inputs": [t.to_json() for t in self.inputs],
                                 "outputs": [t.to_json() for t in self.outputs],
                                 "in_spec": self.in_spec, "out_spec": self.out_spec}
        if self.files is not None:
            found["files"] = {name: record.to_json() for name, record in sorted(self.files.items())}
        return found

    @classmethod
    def from_json(cls, data: Any) -> ModelJson:
        """Raises ValueError, saying what is wrong, for anything but a kiln model.json."""
        record = _object(data, "a model description")
        files = record.get("files")
        return cls(_str(record, "target"),
                   tuple(TensorSpec.from_json(t) for t in _list(record, "inputs")),
                   tuple(TensorSpec.from_json(t) for t in _list(record, "outputs")),
                   record.get("in_spec"), record.get("out_spec"),
                   None if files is None else {name: FileRecord.from_json(f)
                                               for name, f in _object(files, "a files section").items()})


def _object(data: Any, what: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ValueError(f"{what} must be a JSON object")
    return data


def _str(record: Mapping[str, Any], name: str) -> str:
    value = record.get(name)
    if not isinstance(value, str):
        raise ValueError(f"{name!r} must be a string")
    return value


def _list(record: Mapping[str, Any], name: str) -> list[Any]:
    value = record.get(name)
    if not isinstance(value, list):
        raise ValueError(f"{name!r} must be a list")
    return value


def _ints(record: Mapping[str, Any], name: str) -> tuple[int, ...]:
    values = _list(record, name)
    if not all(isinstance(v, int) for v in values):
        raise ValueError(f"{name!r} must be a list of integers")
    return tuple(values)
