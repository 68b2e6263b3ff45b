"""What a stage receives: its inputs, its declared config fields, its environment facts and a
folder to write into. Everything here is plain data, so a job can cross into a worker process
as JSON; a stage sees nothing else (no globals, no environment reads, no clock)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from cache.items import ItemCache
from cache.leases import Lease
from cache.store import Store


@dataclass(frozen=True)
class StageJob:
    stage: str
    model: str
    inputs: dict[str, str]  # "stage/artifact" -> file path
    config: dict[str, Any]  # dotted field -> value, only the fields the stage declared
    env: dict[str, str]
    out: str  # folder the stage writes its artifacts into
    project_root: str  # the model's project (for importing its factory)
    store_root: str  # the artifact store, for per-item entries
    entry: str  # "module:function" that runs the stage
    # A digest of the kiln code that makes the items the stage makes inside itself (a kernel's
    # tuning: all the code the stage runs; link's runtime objects: tasks/link/runtime.py's).
    code: str = ""
    # The target the build is for (cpu, cuda): a build parameter, in the key of every stage that
    # declares it depends on it (Stage.by_target); tasks/targets picks its backend by it.
    target: str = ""
    # What the engine measured of the machine for this build (contract.facts.machine_facts):
    # "cores", "gpus". Not key parts: they spread work, they never change an artifact.
    machine: dict[str, int] = field(default_factory=dict)
    # Where per-kernel work runs (contract/executor_settings.py): "kind" (local, slurm) and
    # slurm's partition, gres, time_min, account, jobs... Not key parts, as `machine`: a cluster
    # run and a local run fill the same cache items. (Its gpu and arch reach the keys only as
    # the cuda target's env facts, where they stand for the nodes' GPU.)
    executor: dict[str, str] = field(default_factory=dict)
    # An in-memory model handed to pipeline.compile(); never serialized. Only trace reads it.
    live: Any = field(default=None, compare=False)
    # Where a stage in a worker process reports progress for the live display ("" in process).
    progress_file: str = field(default="", compare=False)
    # Where a worker lists the library modules it imported, for the stage server to import ahead
    # of the next compile's workers (pipeline/server.py); "" where there is no server.
    learn_file: str = field(default="", compare=False)
    # Where the workers of stages that build the model list the libraries they import, so a
    # worker waiting for such a stage imports them meanwhile (contract/libraries.py); "": none.
    libraries_file: str = field(default="", compare=False)
    # The running compile's lease (cache/leases.py): the items the stage reads and writes join it.
    lease: str = field(default="", compare=False)
    # What the stage's item cache warned about (a corrupt item recomputed), for the runner to show.
    warnings: list[str] = field(default_factory=list, compare=False)

    def input(self, ref: str) -> Path:
        return Path(self.inputs[ref])

    @property
    def out_dir(self) -> Path:
        return Path(self.out)

    def items(self) -> ItemCache:
        """Per-item cache for fan-out work inside the stage (one entry per kernel, say)."""
        lease = Lease.join(self.lease) if self.lease else None
        return ItemCache(Store(Path(self.store_root), warn=self.warnings.append, lease=lease), self.stage)

    def progress(self, done: int, total: int, what: str) -> None:
        """Tell the live display how far a long stage is ("12/40 kernels tuned"); never an input,
        never in an artifact. Written whole, then renamed, so a reader never sees half a line."""
        if not self.progress_file:
            return
        path = Path(self.progress_file)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps([done, total, what]))
        tmp.replace(path)

    def to_json(self) -> str:
        data = asdict(self)
        data.pop("live")
        return json.dumps(data, sort_keys=True, indent=1)

    @classmethod
    def from_json(cls, text: str) -> StageJob:
        return cls(**json.loads(text))
