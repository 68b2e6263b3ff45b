"""The autotune stage for the cuda target: kernels.json -> tuning.json, timings.json, cubins/.

With a GPU, every kernel missing from the per-kernel cache is tuned by tune.py's workers (one
per visible GPU) and its winner's cubin kept; a kernel whose default is near its memory bound
settles on it (tune.settles). Without one, each kernel's default candidate is
compiled for the configured arch and marked untuned: a cross-compile, and what CI checks.

Note: a kernel's cache item is keyed by its module's source, its candidates, the GPU's model
(or "none" and the arch), the arch, the ptxas versions and the triton and torch versions, so a
one-layer edit re-tunes only the kernels whose source changed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from cache.hashing import digest_file, digest_json, pretty_json
from contract.errors import KilnError
from contract.executor_settings import SLURM
from contract.facts import gpu_arch, gpu_name
from contract.job import StageJob
from contract.timings import LIBRARY, TimingRecord, timings_json
from tasks.autotune.coverage import coverage, coverage_text, placed
from tasks.autotune.executors import kind_of
from tasks.targets.cuda import tune as cuda_tune
from tasks.targets.cuda.decisions import CudaDecision, LaunchFacts, tuning_json
from tasks.targets.cuda.spec import CudaKernelEntry, CudaKernelsJson

if TYPE_CHECKING:
    from cache.items import ItemCache
    from tasks.autotune.remote import Remote

CUBINS = "cubins"  # <key16>.cubin and <key16>.json (kernel name, warps, shared memory, scratch)


def run(job: StageJob) -> Mapping[str, Any]:
    kernels_json = job.input("gen-tuning-code/kernels.json")
    spec = CudaKernelsJson.from_json(json.loads(kernels_json.read_text()))
    folder = kernels_json.parent / spec.folder
    gpu = job.env.get("gpu", "none")
    tuner = job.code  # all the code the stage runs: this module's, the tuner's, what they import
    items = job.items()
    parts = _all_parts(spec, folder, job.env, tuner)
    missing = [e for e in spec.kernels if items.lookup(parts[e.key]) is None]
    started = time.perf_counter()
    remote = _remote(job, missing, kernels_json)
    with tempfile.TemporaryDirectory() as tmp:
        made = Path(tmp)
        try:
            fresh = {} if remote is None else _fetched(remote, missing, made)
        finally:
            if remote is not None:
                shutil.rmtree(remote.folder, ignore_errors=True)
        rest = [e for e in missing if e.key not in fresh]
        if gpu == "none":
            fresh |= _cross_compile(spec, rest, folder, made, job.machine.get("cores", 1),
                                   lambda n, total: job.progress(n, total, "kernels compiled"))
        elif rest:
            here = (gpu_name(), gpu_arch())
            if remote is not None and here != (gpu, job.env.get("arch", "")):  # the jobs' work is kept
                for key in fresh:
                    _filed(key, parts[key], fresh, made, items)
                _no_gpu_here(f"{gpu} ({job.env.get('arch', '')})", f"{here[0]} ({here[1]})", rest, remote)
            fresh |= _tune(kernels_json, rest, made, max(1, job.machine.get("gpus", 1)),
                           lambda n, total: job.progress(n, total, "kernels tuned"))
        records, used, hits = _store(spec, parts, fresh, made, items, job.out_dir / CUBINS)
    seconds = time.perf_counter() - started
    decisions = {key: _decision(r, job.out_dir / CUBINS / key[:16]) for key, r in records.items()}
    (job.out_dir / "tuning.json").write_text(pretty_json(tuning_json(decisions)))
    (job.out_dir / "timings.json").write_text(pretty_json(timings_json(records)))
    covered = coverage(records)
    untuned = covered["kernels"] - covered["tuned"]
    peak = max((r.peak_bytes for r in records.values()), default=0)
    note = f"{coverage_text(covered)} ({hits} cached)"
    if remote is not None:
        note += "; " + remote.note(len(rest))
    if gpu == "none":
        note += f" (no GPU: default candidates for sm_{spec.arch})"
    elif len(records) > hits:
        settled = sum(bool(r.extra.get("settled")) for r in records.values())
        note += (f"; {settled} settled by their default (tune.py --full times every candidate)"
                 f"; tuning {seconds:.1f} s, peak {peak / 2**20:.1f} MB on {gpu}")
    return {"kernels": len(records), "cached": hits, "untuned": untuned, "coverage": covered,
            "tuning_seconds": round(seconds, 3), "peak_gpu_bytes": peak, "items": used, "summary": note}


def _remote(job: StageJob, missing: list[CudaKernelEntry], kernels_json: Path) -> Remote | None:
    """The misses tuned as Slurm jobs on the nodes' GPU, where the build asked for that."""
    if not missing or kind_of(job.executor) != SLURM:
        return None
    from tasks.autotune.remote import tune_remotely
    from tasks.targets.cuda.remote import NODE_FACTS, tune_share

    payload = {"spec": str(kernels_json), "facts": {fact: job.env.get(fact, "") for fact in NODE_FACTS}}
    return tune_remotely(tune_share, [e.key for e in missing], payload, job.executor, Path(job.store_root))


def _fetched(remote: Remote, missing: list[CudaKernelEntry], made: Path) -> dict[str, Any]:
    """The records of the kernels the jobs tuned, their cubins put where _store looks."""
    from tasks.targets.cuda.remote import RECORD, SUFFIXES

    fresh: dict[str, Any] = {}
    for entry in missing:
        if remote.has(entry.key):
            folder = remote.folder / entry.key
            for suffix in SUFFIXES:  # none where a matmul pair's library calls won
                if (folder / f"kernel{suffix}").is_file():
                    shutil.copyfile(folder / f"kernel{suffix}", made / f"{entry.key[:16]}{suffix}")
            fresh[entry.key] = json.loads((folder / RECORD).read_text())
    return fresh


def _no_gpu_here(gpu: str, here: str, rest: list[CudaKernelEntry], remote: Remote) -> NoReturn:
    """Kernels the jobs did not tune are tuned here, which only the keys' GPU may do."""
    raise KilnError(f"{len(rest)} kernel(s) were not tuned on the cluster "
                    f"({remote.error or 'their jobs left no result'}), and this machine has no {gpu} "
                    f"to tune them on (it has {here})",
                    "check the executor's gpu and arch settings against the nodes' GPU, and the "
                    "jobs' logs (sacct), then compile again: what the jobs finished stays cached")


def _decision(record: TimingRecord, stem: Path) -> CudaDecision:
    """A kernel's decision: its record's choice, its cubin's digest and its launch facts (none
    where a matmul pair's library calls won: nothing is launched for the pair)."""
    config = {name: int(value) for name, value in record.config.items()}
    if record.variant == LIBRARY:
        return CudaDecision(record.variant, record.function, config, record.tuned, "", None)
    launch = LaunchFacts.from_json(json.loads(stem.with_suffix(".json").read_text()))
    return CudaDecision(record.variant, record.function, config, record.tuned,
                        digest_file(stem.with_suffix(".cubin")), launch)


def _tune(kernels_json: Path, missing: list[CudaKernelEntry], made: Path, gpus: int,
          on_progress: Callable[[int, int], None]) -> dict[str, Any]:
    if not missing:
        return {}
    records = cuda_tune.tune_all(kernels_json, [e.key for e in missing], made, gpus, on_progress)
    for entry in missing:
        r = records[entry.key]
        if r.get("variant") == LIBRARY or (made / f"{entry.key[:16]}.cubin").is_file():
            continue
        if not entry.compiles_default():  # a matmul pair whose tuning died: the library's calls
            records[entry.key] = _untuned_record(entry) | {"errors": r.get("errors", {})}
            continue
        raise KilnError(f"kernel {entry.kernel}: no candidate runs on this GPU ({r.get('errors')})",
                        "this is a bug in kiln's Triton code generation; please report it")
    return records


def _cross_compile(spec: CudaKernelsJson, missing: list[CudaKernelEntry], folder: Path, made: Path,
                   cores: int, on_progress: Callable[[int, int], None]) -> dict[str, Any]:
    """Each kernel's default variant and config, compiled for the arch: one worker process per
    core (triton's compiler holds the GIL), each importing triton once for its share."""
    records: dict[str, Any] = {e.key: _untuned_record(e) for e in missing if not e.compiles_default()}
    total = len(missing)
    missing = [e for e in missing if e.compiles_default()]
    if not missing:
        return records
    workers = max(1, min(cores, len(missing)))
    shares = [missing[w::workers] for w in range(workers)]
    lock = threading.Lock()

    def run_share(share: list[CudaKernelEntry]) -> None:
        jobs = [{"entry": e.to_json(), "folder": str(folder), "function": e.default()[0].function,
                 "config": dict(e.default()[1]), "arch": spec.arch, "stem": str(made / e.key[:16])}
                for e in share]
        env = dict(os.environ, TRITON_DISABLE_LINE_INFO="1")
        env.pop("TRITON_INTERPRET", None)
        with tempfile.TemporaryFile("w+") as errors:
            proc = subprocess.Popen([sys.executable, "-c", _COMPILE_SHARE], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=errors, text=True, env=env)
            assert proc.stdin is not None
            assert proc.stdout is not None
            proc.stdin.write(json.dumps(jobs))
            proc.stdin.close()
            for line in proc.stdout:  # one key per kernel compiled
                entry = next(e for e in share if e.key == line.strip())
                with lock:
                    records[entry.key] = _untuned_record(entry)
                    on_progress(len(records), total)
            status = proc.wait()
            errors.seek(0)
            err = errors.read()
        if status != 0:
            failed = next(e for e in share if e.key not in records)
            raise KilnError(f"kernel {failed.kernel}: its default candidate does not compile for "
                            f"sm_{spec.arch}:\n{err[-2000:]}",
                            "this is a bug in kiln's Triton code generation; please report it")

    with ThreadPoolExecutor(max_workers=workers) as pool:
        for future in [pool.submit(run_share, share) for share in shares]:
            future.result()
    return records


def _untuned_record(entry: CudaKernelEntry) -> dict[str, Any]:
    """The record of a kernel compiled without a GPU, in a tuner's form."""
    variant, config = entry.default()
    label = f"{variant.name}:0"
    return {"key": entry.key, "label": label, "variant": variant.name, "function": variant.function,
            "config": dict(config), "default": label, "timings": {}, "errors": {}, "gain": None,
            "tuned": False}


_ROOT = str(Path(__file__).resolve().parents[3])  # the project root (tasks/targets/cuda/autotune.py)
_COMPILE_SHARE = f"""
import json, sys
from pathlib import Path
sys.path.insert(0, {_ROOT!r})
from tasks.targets.cuda import tune as cuda_tune
from tasks.targets.cuda.decisions import CudaDecision, LaunchFacts, tuning_json
for job in json.loads(sys.stdin.read()):
    cuda_tune.compile_cubin(job["entry"], Path(job["folder"]), job["function"], job["config"], job["arch"],
                            Path(job["stem"]))
    print(job["entry"]["key"], flush=True)
"""


def _store(spec: CudaKernelsJson, parts: dict[str, dict[str, str]], fresh: dict[str, Any], made: Path,
           items: ItemCache, cubins: Path) -> tuple[dict[str, TimingRecord], list[str], int]:
    """Every kernel's record and cubin: fresh ones into the cache, all into cubins/."""
    cubins.mkdir()
    records: dict[str, TimingRecord] = {}
    used: list[str] = []
    hits = 0
    for entry in spec.kernels:
        key = entry.key
        item, hit = _filed(key, parts[key], fresh, made, items)
        hits += hit
        used.append(f"{item.stage}/{item.key}")
        record = json.loads(item.file("record.json").read_text())
        functions = {v.name: v.function for v in entry.variants}
        records[key] = placed(record, entry, functions.get(record["variant"], record["function"]))
        for suffix in (".cubin", ".json"):  # none where a matmul pair's library calls won
            if f"kernel{suffix}" in item.artifacts:
                shutil.copyfile(item.file(f"kernel{suffix}"), cubins / f"{key[:16]}{suffix}")
    return records, used, hits


def _filed(key: str, parts: dict[str, str], fresh: dict[str, Any], made: Path,
           items: ItemCache) -> tuple[Any, bool]:
    """A kernel's cache item (made from `fresh` and the cubin in `made` on a miss), and whether
    it was a hit."""

    def compute(out: Path) -> dict[str, Any]:
        for suffix in (".cubin", ".json"):
            if (made / f"{key[:16]}{suffix}").is_file():
                shutil.copyfile(made / f"{key[:16]}{suffix}", out / f"kernel{suffix}")
        (out / "record.json").write_text(pretty_json(fresh[key]))
        return {"tuned": fresh[key].get("tuned", False)}

    return items.get_or_compute(parts, compute)


def _all_parts(spec: CudaKernelsJson, folder: Path, env: Mapping[str, str],
               tuner: str) -> dict[str, dict[str, str]]:
    """Every entry's cache item parts. A matmul pair's hold its facts and its epilogue kernel's
    parts too: the library's way it is timed against runs that kernel's default candidate."""
    parts = {e.key: _item_parts(e, folder, spec.arch, env, tuner) for e in spec.kernels}
    for e in spec.kernels:
        if e.matmul is not None:
            parts[e.key] |= {"matmul": digest_json(e.matmul.to_json()),
                             "epilogue": digest_json(parts[e.matmul.epilogue])}
    return parts


def _item_parts(entry: CudaKernelEntry, folder: Path, arch: int, env: Mapping[str, str],
                tuner: str) -> dict[str, str]:
    gpu = env.get("gpu", "none")
    # Note: the kernel's name (k12_...) says where it sits in this model, so it is left out: the
    # same kernel one layer further down is the same cache item.
    source = (folder / entry.file).read_text().replace(entry.kernel, "KERNEL")
    candidates = [[v.name, [dict(c) for c in v.configs]] for v in entry.variants]
    return {"kernel": entry.key, "source": digest_json(source),
            "candidates": digest_json(candidates), "params": digest_json([p.to_json() for p in entry.params]),
            "gpu": gpu if gpu != "none" else f"none/sm_{arch}", "triton": env.get("triton", ""),
            "torch": env.get("torch", ""), "ptxas": env.get("ptxas", ""), "arch": env.get("arch", ""),
            "tuner": tuner}
