"""The autotune stage for the cpu target: kernels.json -> tuning.json, one cache entry per kernel.

Note: each kernel's record is cached under a key of its own (its variants' sources, the
compiler and flags, the tuner's code), so a one-layer edit re-tunes only the kernels whose
source changed; all the others are found in the cache.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cache.hashing import digest_file, digest_json, pretty_json
from contract.errors import KilnError
from contract.executor_settings import SLURM
from contract.job import StageJob
from contract.timings import TimingRecord, timings_json
from contract.toolchain import cxx
from tasks.autotune.coverage import coverage, coverage_text, placed
from tasks.autotune.executors import kind_of
from tasks.targets.cpu.decisions import CpuDecision, tuning_json
from tasks.targets.cpu.spec import CpuKernelEntry, CpuKernelsJson

if TYPE_CHECKING:
    from tasks.autotune.remote import Remote
    from tasks.targets.cpu.tune import Built

TUNING = "tuning.json"  # decisions only: what later stages read, so it is deterministic
TIMINGS = "timings.json"  # the measurements behind them, for people and the report
OBJECTS = "objects"  # <key16>.o: each kernel's winning variant, compiled; link links them
OBJECT = "kernel.o"
REPEAT = 10


def run(job: StageJob) -> Mapping[str, Any]:
    kernels_json = job.input("gen-tuning-code/kernels.json")
    spec = CpuKernelsJson.from_json(json.loads(kernels_json.read_text()))
    folder = kernels_json.parent / spec.folder
    # Note: kernels.json names the compiler (tune.py finds it on PATH); here it is the one the
    # `cxx` key fact names.
    compiler = [cxx(), *spec.compiler[1:]]
    items = job.items()
    tuner = job.code  # all the code the stage runs: this module's, the tuner's, what they import
    parts = {e.key: _item_parts(e, folder, spec.compiler, job.env, tuner) for e in spec.kernels}
    missing = [e.to_json() for e in spec.kernels if items.lookup(parts[e.key]) is None]
    remote = _remote(job, missing, kernels_json, compiler)
    try:
        if remote is not None:
            missing = [e for e in missing if not remote.has(e["key"])]
        records, used, hits = _items(job, spec, parts, missing, compiler, remote)
    finally:  # what the jobs left is filed by now, or of no use
        if remote is not None:
            shutil.rmtree(remote.folder, ignore_errors=True)
    objects = job.out_dir / OBJECTS
    decisions = {key: CpuDecision(r.variant, r.config, digest_file(objects / f"{key[:16]}.o"))
                 for key, r in records.items()}
    (job.out_dir / TUNING).write_text(pretty_json(tuning_json(decisions)))
    (job.out_dir / TIMINGS).write_text(pretty_json(timings_json(records)))
    covered = coverage(records)
    note = f"{coverage_text(covered)} ({hits} cached)"
    if remote is not None:
        note += "; " + remote.note(len(missing))
    return {"kernels": len(records), "cached": hits, "coverage": covered, "items": used, "summary": note}


def _items(job: StageJob, spec: CpuKernelsJson, parts: dict[str, dict[str, str]],
           missing: list[dict[str, Any]], compiler: list[str],
           remote: Remote | None) -> tuple[dict[str, TimingRecord], list[str], int]:
    """Every kernel's cache item (tuned here, or filed from its job, on a miss), its object
    copied into objects/; the records, the items' names and the count of hits."""
    folder = job.input("gen-tuning-code/kernels.json").parent / spec.folder
    objects = job.out_dir / OBJECTS
    objects.mkdir()
    items = job.items()
    records: dict[str, TimingRecord] = {}
    used: list[str] = []
    hits = 0
    with tempfile.TemporaryDirectory() as tmp:
        # Note: the builds of every kernel not in the cache run in parallel first; timing then
        # runs one kernel at a time, so no two measurements share the CPU. The tuner (and torch,
        # ~1.5 s of imports) is loaded only when a kernel is missing: after an edit whose kernels
        # are all cached this stage only copies their objects.
        built: dict[str, Built] = {}
        if missing:
            from tasks.targets.cpu import tune as cpu_tune

            built = cpu_tune.build_variants(missing, folder, compiler, Path(tmp), job.machine.get("cores"))
        for entry in spec.kernels:

            def compute(out: Path, entry: CpuKernelEntry = entry) -> dict[str, Any]:
                if remote is not None and remote.has(entry.key):
                    return _filed(remote.folder / entry.key, out)
                return _tune(entry, folder, compiler, built.get(entry.key), out)

            item, hit = items.get_or_compute(parts[entry.key], compute)
            hits += hit
            used.append(f"{item.stage}/{item.key}")
            record = json.loads(item.file("record.json").read_text())
            records[entry.key] = placed(record, entry, entry.function)
            job.progress(len(records), len(spec.kernels), "kernels")
            shutil.copyfile(item.file(OBJECT), objects / f"{entry.key[:16]}.o")
    return records, used, hits


def _remote(job: StageJob, missing: list[dict[str, Any]], kernels_json: Path,
            compiler: list[str]) -> Remote | None:
    """The misses tuned as Slurm jobs, where the build asked for that (and there are misses)."""
    if not missing or kind_of(job.executor) != SLURM:
        return None
    from tasks.autotune.remote import tune_remotely
    from tasks.targets.cpu.remote import tune_share

    payload = {"spec": str(kernels_json), "compiler": compiler, "repeat": REPEAT,
               "cxx": job.env.get("cxx", "")}
    return tune_remotely(tune_share, [e["key"] for e in missing], payload, job.executor, Path(job.store_root))


def _filed(made: Path, out: Path) -> dict[str, Any]:
    """A kernel a Slurm job tuned, filed as the cache item a local run would have made."""
    shutil.copyfile(made / OBJECT, out / OBJECT)
    record = json.loads((made / "record.json").read_text())
    (out / "record.json").write_text(pretty_json(record))
    return {"variant": record["variant"]}


def _tune(entry: CpuKernelEntry, folder: Path, compiler: list[str], built: Built | None,
          out: Path) -> dict[str, Any]:
    """One kernel's cache item: its record, and the object of the winning variant."""
    from tasks.targets.cpu import tune as cpu_tune

    plain = entry.to_json()
    with tempfile.TemporaryDirectory() as tmp:
        if built is None:
            built = cpu_tune.build_variants([plain], folder, compiler, Path(tmp))[entry.key]
        record = cpu_tune.tune_kernel(plain, folder, compiler, REPEAT, built)
        winner = built[record["variant"]]
        if isinstance(winner, str):
            raise KilnError(f"kernel {entry.names[0]}: no variant builds ({winner})",
                            "this is a bug in kiln's C++ code generation; please report it")
        shutil.copyfile(winner.with_suffix(".o"), out / OBJECT)
    (out / "record.json").write_text(pretty_json(record))
    return {"variant": record["variant"]}


def _item_parts(entry: CpuKernelEntry, folder: Path, compiler: tuple[str, ...], env: Mapping[str, str],
                tuner: str) -> dict[str, str]:
    sources = [[v.name, digest_file(folder / v.file)] for v in entry.variants]
    header = digest_file(folder / "kiln_cpu.h")
    params = [p.to_json() for p in entry.params]
    return {"kernel": entry.key, "sources": digest_json(sources), "header": header,
            "params": digest_json(params), "compiler": digest_json(list(compiler)),
            "cxx": env.get("cxx", ""), "tuner": tuner}
