"""timings.json, typed: per distinct kernel, what autotune measured and chose, and where the
kernel sits. Written by each target's autotune stage, read by the compile report.

A tuner (tasks/targets/*/tune.py, which runs without kiln) makes a plain record per kernel;
the stage adds the kernel's names, origins and places from kernels.json. Timings are
measurements, so timings.json differs from run to run; tuning.json holds the decisions.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class TimingRecord:
    key: str
    variant: str  # the chosen variant
    label: str  # the chosen candidate: the variant, or on cuda "variant:config-index"
    default: str  # the candidate an untuned build would ship
    config: Mapping[str, Any]
    timings: Mapping[str, float | None]  # candidate -> seconds per call; None: it failed
    errors: Mapping[str, str]  # candidate -> why it failed
    gain: float | None  # the default's time over the winner's
    tuned: bool  # False: nothing was timed (no GPU), the default ships
    function: str = ""  # the chosen variant's function (cpu: every variant's)
    names: tuple[str, ...] = ()
    origins: tuple[str, ...] = ()
    places: tuple[str, ...] = ()
    extra: Mapping[str, Any] = field(default_factory=dict)  # the tuner's other facts (peak_bytes, gpu)

    @property
    def seconds(self) -> float | None:
        return self.timings.get(self.label)

    @property
    def peak_bytes(self) -> int:
        return int(self.extra.get("peak_bytes", 0))

    def to_json(self) -> dict[str, Any]:
        return dict(self.extra) | {
            "key": self.key, "variant": self.variant, "label": self.label, "default": self.default,
            "config": dict(self.config), "timings": dict(self.timings), "errors": dict(self.errors),
            "gain": self.gain, "tuned": self.tuned, "function": self.function, "names": list(self.names),
            "origins": list(self.origins), "places": list(self.places)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TimingRecord:
        """A timings.json record, or a tuner's record (which has no names, origins or places)."""
        known = {"key", "variant", "label", "default", "config", "timings", "errors", "gain", "tuned",
                 "function", "names", "origins", "places"}
        gain = data.get("gain")
        timings = {str(k): None if v is None else float(v) for k, v in data["timings"].items()}
        errors = {str(k): str(v) for k, v in data["errors"].items()}
        return cls(str(data["key"]), str(data["variant"]), str(data.get("label", data["variant"])),
                   str(data["default"]), dict(data["config"]), timings, errors,
                   None if gain is None else float(gain), bool(data.get("tuned", True)),
                   str(data.get("function", "")), _strings(data, "names"), _strings(data, "origins"),
                   _strings(data, "places"), {k: v for k, v in data.items() if k not in known})


def _strings(data: Mapping[str, Any], name: str) -> tuple[str, ...]:
    return tuple(map(str, data.get(name, ())))


MATMUL_PAIR = "mm_"  # a cuda matmul pair's names: this, then its epilogue kernel's name
TEMPLATE, LIBRARY = "matmul", "library"  # a pair's variants: one kernel, or the call and the kernel apart


def fused_kernels(records: Mapping[str, TimingRecord]) -> set[str]:
    """The kernel launches that run inside a matmul template that won: none of their own."""
    return {name.removeprefix(MATMUL_PAIR) for r in records.values() if r.variant == TEMPLATE
            for name in r.names}


def timings_json(records: Mapping[str, TimingRecord]) -> dict[str, Any]:
    return {key: record.to_json() for key, record in sorted(records.items())}


def read_timings(data: Mapping[str, Any]) -> dict[str, TimingRecord]:
    return {str(key): TimingRecord.from_json(record) for key, record in data.items()}
