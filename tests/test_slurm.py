"""`--executor slurm` on a real Slurm cluster that the test starts on this machine and stops
(scripts/slurm_local.sh): the cpu target's kernels are tuned by Slurm jobs, land in the same
per-kernel cache items a local run uses, and a job that dies is made up for here."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from contract.config import load_config
from contract.errors import KilnError
from pipeline.build import Cache, compile_model
from pipeline.runner import BuildOptions, BuildResult

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "slurm_local.sh"


def _free_ports(count: int) -> int:
    """A base port with `count` free ports from it. The search starts at a place of this
    process's own, so two test workers starting clusters at once do not pick the same ports."""
    start = 21000 + (os.getpid() % 1500) * 12
    bases: list[int] = [*range(start, 40000, 97), *range(21000, start, 97)]
    for base in bases:
        try:
            for port in range(base, base + count):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
    raise RuntimeError("no free ports")


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A single-node cluster of this test's own (its folder, its ports); its environment."""
    pytest.importorskip("pydra")
    env = dict(os.environ, KILN_SLURM_DIR=str(tmp_path_factory.mktemp("slurm")),
               KILN_SLURM_PORT=str(_free_ports(4)))
    up = subprocess.run(["bash", str(SCRIPT), "up"], env=env, capture_output=True, text=True, timeout=300,
                        check=False)
    assert up.returncode == 0, up.stderr
    conf = subprocess.run(["bash", str(SCRIPT), "env"], env=env, capture_output=True, text=True, check=True)
    env["SLURM_CONF"] = conf.stdout.strip().split("=", 1)[1]
    try:
        yield env
    finally:
        subprocess.run(["bash", str(SCRIPT), "down"], env=env, capture_output=True, timeout=120, check=False)


def _jobs(env: dict[str, str]) -> dict[str, tuple[str, str]]:
    """Every job the cluster's accounting knows: id -> (name, state)."""
    out = subprocess.run(["sacct", "-a", "-n", "-X", "-P", "-S", "2000-01-01", "-o", "JobID,JobName,State"],
                         env=env, capture_output=True, text=True, check=True).stdout
    return {line.split("|")[0]: (line.split("|")[1], line.split("|")[2]) for line in out.splitlines() if line}


def _autotune_note(result: BuildResult) -> str:
    return next(row.note for row in result.rows if row.stage == "autotune")


def test_slurm_jobs_tune_the_kernels_into_the_cache_a_local_run_shares(
        slurm: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_CONF", slurm["SLURM_CONF"])
    cache = Cache.open(tmp_path / "cache")
    config = load_config("mlp")
    remote = compile_model(config, BuildOptions("cpu", tmp_path / "slurm", executor="slurm"), cache)
    timings = json.loads(remote.entries["autotune"].file("timings.json").read_text())
    assert "slurm jobs" in _autotune_note(remote)
    jobs = _jobs(slurm)
    for record in timings.values():  # each kernel was tuned by a job that Slurm ran to its end
        job_id = record["where"].split()[2]
        assert jobs[job_id][0].startswith("kiln-"), (record, jobs)
        assert jobs[job_id][1] == "COMPLETED", (record, jobs)
        assert all(t is not None for t in record["timings"].values()), record

    # The stage's own entry goes (its per-kernel items stay), so the local run's autotune runs.
    doomed = cache.store.move_out("autotune", remote.entries["autotune"].key)
    assert doomed is not None
    shutil.rmtree(doomed)
    local = compile_model(config, BuildOptions("cpu", tmp_path / "local", executor="local"), cache)
    assert next(row.status for row in local.rows if row.stage == "autotune") == "ran"
    assert f"({len(timings)} cached)" in _autotune_note(local)  # the jobs' items are a local run's hits
    tuning = [r.entries["autotune"].file("tuning.json").read_bytes() for r in (remote, local)]
    assert tuning[0] == tuning[1]
    assert (tmp_path / "slurm" / "model.so").read_bytes() == (tmp_path / "local" / "model.so").read_bytes()
    before = set(_jobs(slurm))
    again = compile_model(config, BuildOptions("cpu", tmp_path / "again", executor="slurm"), cache)
    assert all(row.status != "ran" for row in again.rows)
    assert set(_jobs(slurm)) == before  # a no-op recompile submits nothing


def test_a_node_without_the_keys_gpu_tunes_nothing_for_the_cuda_target(
        slurm: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cuda target's kernels are keyed by the nodes' GPU (the executor's gpu and arch), so a
    node with another GPU (this one has none) refuses its share, and this host, which has no such
    GPU either, says so rather than file a cross-compile under the GPU's key."""
    monkeypatch.setenv("SLURM_CONF", slurm["SLURM_CONF"])
    monkeypatch.setenv("KILN_SLURM_JOBS", "1")
    cache = Cache.open(tmp_path / "cache")
    options = BuildOptions("cuda", tmp_path / "b", executor="slurm")
    with pytest.raises(KilnError, match="kiln must know which before it submits"):
        compile_model(load_config("mlp"), options, cache)
    monkeypatch.setenv("KILN_SLURM_GPU", "NVIDIA H200")
    monkeypatch.setenv("KILN_SLURM_ARCH", "sm_90")
    with pytest.raises(KilnError) as failed:
        compile_model(load_config("mlp"), options, cache)
    assert "were not tuned on the cluster" in str(failed.value)
    assert re.search(r"slurm job \d+ on \S+ has gpu 'none', not 'NVIDIA H200'\)", str(failed.value)), \
        failed.value  # the job ran, and refused: of the key's facts, only the GPU differs
    assert "this machine has no NVIDIA H200 (sm_90) to tune them on (it has none" in str(failed.value)
    assert not any(cache.store.root.glob("tmp/autotune-remote-*"))  # the jobs' folder is gone


def test_a_cancelled_job_s_kernels_are_tuned_here_and_the_report_says_so(
        slurm: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_CONF", slurm["SLURM_CONF"])
    monkeypatch.setenv("KILN_SLURM_JOBS", "1")
    cancelled: list[str] = []
    stop = threading.Event()

    def cancel_the_first_kiln_job() -> None:
        while not stop.is_set() and not cancelled:
            queue = subprocess.run(["squeue", "-h", "-o", "%i %j"], env=slurm, capture_output=True,
                                   text=True, check=False).stdout.split()
            for job_id, name in zip(queue[::2], queue[1::2], strict=True):
                if name.startswith("kiln-"):
                    subprocess.run(["scancel", job_id], env=slurm, check=True)
                    cancelled.append(job_id)
            time.sleep(0.05)

    watcher = threading.Thread(target=cancel_the_first_kiln_job)
    watcher.start()
    try:
        result = compile_model(load_config("mlp"), BuildOptions("cpu", tmp_path / "b", executor="slurm"),
                               Cache.open(tmp_path / "cache"))
    finally:
        stop.set()
        watcher.join()
    assert cancelled
    assert "rerun here, as their job did not finish" in _autotune_note(result)
    timings = json.loads(result.entries["autotune"].file("timings.json").read_text())
    assert all(t is not None for r in timings.values() for t in r["timings"].values())


def test_an_interrupted_compile_leaves_no_job_behind(slurm: dict[str, str], tmp_path: Path) -> None:
    """kill -9 of the compile while its jobs run (wide: 200 kernels, so they run for a while):
    the jobs end cancelled, not completed."""
    env = dict(slurm, KILN_EXECUTOR="slurm", KILN_SLURM_JOBS="2")
    cmd = [sys.executable, "-m", "kiln", "--cache-dir", str(tmp_path / "cache"), "compile", "wide",
           "--target", "cpu", "--quiet", "--out", str(tmp_path / "out")]
    errors = (tmp_path / "stderr").open("w+")
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=errors)

    def queued() -> list[str]:
        out = subprocess.run(["squeue", "-h", "-o", "%j"], env=slurm, capture_output=True, text=True,
                             check=False).stdout
        return [name for name in out.split() if name.startswith("kiln-")]

    deadline = time.monotonic() + 180
    while not queued() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    names = set(queued())
    errors.seek(0)
    assert names, f"no job was submitted (exit {proc.poll()}): {errors.read()[-2000:]}"
    os.killpg(proc.pid, 9)  # as hard as it gets: no handler runs in any of kiln's processes
    proc.wait()
    deadline = time.monotonic() + 30
    while queued() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not queued()
    ended: set[str] = set()
    while not ended and time.monotonic() < deadline + 30:  # slurmdbd records the end a little later
        ended = {state for name, state in _jobs(slurm).values() if name in names}
        time.sleep(0.5)
    assert ended, names
    assert all(state.startswith("CANCELLED") for state in ended), ended  # "CANCELLED by 0"


def test_the_executor_comes_from_the_flag_then_the_environment_then_the_config(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from contract.executor_settings import SLURM_SETTINGS, resolve
    from tasks.autotune.executors import Slurm, kind_of, shares_of

    for name in ("EXECUTOR", *(f"SLURM_{n.upper()}" for n in SLURM_SETTINGS)):
        monkeypatch.delenv(f"KILN_{name}", raising=False)
    assert resolve(None, {}) == {"kind": "local"}
    configured = {"kind": "slurm", "partition": "cpu", "time_min": "5", "jobs": "4"}
    assert resolve(None, configured) == configured
    assert resolve("local", configured) == {"kind": "local"}
    monkeypatch.setenv("KILN_EXECUTOR", "slurm")
    monkeypatch.setenv("KILN_SLURM_PARTITION", "gpu")
    monkeypatch.setenv("KILN_SLURM_GRES", "gpu:1")
    settings = resolve(None, {})
    assert settings == {"kind": "slurm", "partition": "gpu", "gres": "gpu:1"}
    assert resolve(None, configured) == {**configured, "partition": "gpu", "gres": "gpu:1"}
    assert resolve("local", {}) == {"kind": "local"}
    args = Slurm.from_settings(settings).sbatch_args("kiln-x")
    assert args == "-J kiln-x -t 30 --no-requeue --exclusive -p gpu --gres=gpu:1"
    assert shares_of(["a", "b", "c"], 2) == [["a", "c"], ["b"]]
    assert shares_of(["a"], 4) == [["a"]]
    with pytest.raises(KilnError, match="executor='sge' is no executor"):
        kind_of({"kind": "sge"})
    monkeypatch.setenv("KILN_SLURM_TIME_MIN", "1:00:00")
    with pytest.raises(KilnError, match="KILN_SLURM_TIME_MIN='1:00:00' is not a whole number of minutes"):
        resolve(None, {})
    monkeypatch.setenv("KILN_EXECUTOR", "sge")
    with pytest.raises(KilnError, match="KILN_EXECUTOR='sge' is no executor"):
        resolve(None, {})


def test_a_config_executor_table_is_checked_and_kept_out_of_the_fields(tmp_path: Path) -> None:

    body = (ROOT / "configs" / "mlp.toml").read_text()
    path = tmp_path / "configs" / "m.toml"
    path.parent.mkdir()
    path.write_text(body + '\n[executor]\nkind = "slurm"\npartition = "cpu"\ntime_min = 5\n'
                    'queue_min = 0.5\nexclusive = false\n')
    config = load_config(str(path))
    assert config.executor == {"kind": "slurm", "partition": "cpu", "time_min": "5",
                               "queue_min": "0.5", "exclusive": "0"}
    assert not any(name.startswith("executor") for name in config.fields)
    for table, error in (('time_min = "1:00"', r"executor.time_min='1:00' is not a whole number"),
                         ('kind = "sge"', "executor.kind='sge' is no executor"),
                         ('nodes = 2', r"unknown key\(s\) nodes in \[executor\]"),
                         ('jobs = 0', "executor.jobs='0' is not a whole number")):
        path.write_text(body + f"\n[executor]\n{table}\n")
        with pytest.raises(KilnError, match=error):
            load_config(str(path))


def test_the_cuda_target_s_tuning_gpu_on_a_cluster_is_the_settings_not_this_host_s() -> None:
    from contract.executor_settings import check_setting
    from contract.facts import env_fact

    cluster = {"kind": "slurm", "gpu": "NVIDIA H200", "arch": "sm_90"}
    assert env_fact("gpu", "cuda", cluster) == "NVIDIA H200"
    assert env_fact("arch", "cuda", cluster) == "sm_90"
    assert env_fact("gpu", "cpu", cluster) == "none"  # the cpu target has no tuning GPU
    assert env_fact("gpu", "cuda", {"kind": "local", "gpu": "Imaginary GPU"}) == env_fact("gpu", "cuda")
    with pytest.raises(KilnError, match="kiln must know which before it submits"):
        env_fact("gpu", "cuda", {"kind": "slurm", "gpu": "NVIDIA H200"})
    with pytest.raises(KilnError, match="KILN_SLURM_GPU='none' names no GPU"):
        check_setting("gpu", "none", "KILN_SLURM_GPU")


def test_the_engine_overhead_counts_only_time_no_job_was_tuning() -> None:
    from tasks.autotune.remote import Remote, union_seconds

    assert union_seconds([(0, 2), (1, 3), (5, 6)]) == 4  # overlapping jobs count once, gaps not at all
    remote = Remote(Path("."), 2, 200, seconds=10.0, tuning_seconds=8.0, places=("a", "b"), error="")
    assert remote.note(0).endswith("engine overhead 10 ms a kernel")
    assert "3 rerun here, as their job did not finish (no result)" in remote.note(3)


def test_jobs_that_wait_in_the_queue_too_long_are_cancelled_and_tuned_here(
        slurm: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_CONF", slurm["SLURM_CONF"])
    monkeypatch.setenv("KILN_SLURM_PARTITION", "down")  # its jobs wait for ever
    monkeypatch.setenv("KILN_SLURM_QUEUE_MIN", "0.05")  # 3 s
    result = compile_model(load_config("mlp"), BuildOptions("cpu", tmp_path / "b", executor="slurm"),
                           Cache.open(tmp_path / "cache"))
    note = _autotune_note(result)
    assert "3 rerun here, as their job did not finish" in note, note
    assert "still pending after 0.05 min were cancelled" in note, note


def test_a_node_with_another_compiler_tunes_nothing(tmp_path: Path) -> None:
    """Its objects would be filed under this build's compiler key: it refuses, and says why."""
    from tasks.targets.cpu.remote import tune_share

    result = compile_model(load_config("mlp"), BuildOptions("cpu", tmp_path / "b", until="gen-tuning-code"),
                           Cache.open(tmp_path / "cache"))
    spec = result.entries["gen-tuning-code"].file("kernels.json")
    keys = [k["key"] for k in json.loads(spec.read_text())["kernels"]]
    out = tmp_path / "out"
    out.mkdir()
    tune_share(json.dumps({"spec": str(spec), "compiler": ["g++"], "repeat": 1, "cxx": "g++ 0.0 (not here)",
                           "keys": keys, "out": str(out)}))
    marks = [json.loads(p.read_text()) for p in out.glob("share-*.json")]
    assert len(marks) == 1
    assert "not 'g++ 0.0 (not here)'" in marks[0]["said"]
    assert not any((out / key).exists() for key in keys)

    # A node of the right compiler on which no variant of a kernel builds names the kernels.
    from contract.facts import env_fact

    again = tmp_path / "again"
    again.mkdir()
    cxx = env_fact("cxx", "cpu")
    tune_share(json.dumps({"spec": str(spec), "compiler": ["false"], "repeat": 1, "cxx": cxx,
                           "keys": keys[:1], "out": str(again)}))
    marks = [json.loads(p.read_text()) for p in again.glob("share-*.json")]
    name = json.loads(spec.read_text())["kernels"][0]["names"][0]
    assert f"could not tune {name} (build failed: false exited with status 1)" in marks[0]["said"], marks
