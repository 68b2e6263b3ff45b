"""`kiln explain MODEL`: for each stage, would it rerun, and which key part changed.

Like ninja's `-d explain`: it computes each stage's key parts as a compile would, without
running anything, and compares them with the parts recorded by the last compile of this
model. A stage below one that would rerun can only be judged after that stage has run (early
cutoff may still spare it), and is reported so.
"""

from __future__ import annotations

from dataclasses import dataclass

from cache.records import Records
from cache.store import Store
from contract.config import ModelConfig
from pipeline.keys import diff_parts
from pipeline.progress import QuietDisplay
from pipeline.runner import BuildOptions, Runner
from pipeline.stages import STAGES, Stage


@dataclass(frozen=True)
class Verdict:
    stage: str
    rerun: str  # "no" | "yes" | "maybe" | "not built"
    reasons: tuple[str, ...]


def explain(
    config: ModelConfig,
    options: BuildOptions,
    store: Store,
    records: Records,
    stages: tuple[Stage, ...] = STAGES,
) -> list[Verdict]:
    runner = Runner(config, options, store, records, QuietDisplay(), stages)
    verdicts: list[Verdict] = []
    pending: set[str] = set()
    for stage in stages:
        if not stage.built_for(options.target):
            verdicts.append(Verdict(stage.name, "not built", (f"planned: {stage.planned}",)))
            break
        waiting = [up for up in stage.upstream if up in pending]
        if waiting:
            reason = f"depends on {', '.join(waiting)}, which reruns first (early cutoff may spare it)"
            verdicts.append(Verdict(stage.name, "maybe", (reason,)))
            pending.add(stage.name)
            continue
        verdict = _judge(runner, stage, records)
        if verdict.rerun == "yes":
            pending.add(stage.name)
        verdicts.append(verdict)
    return verdicts


def summary(verdicts: list[Verdict]) -> str:
    """One line for what a compile would do, where the verdicts say it plainly."""
    rerun = {v.stage for v in verdicts if v.rerun != "no"}
    if not rerun:
        return "nothing changed: a compile publishes the cached build"
    if rerun == {"weights"}:
        return "weights changed; program unchanged: only the weights file is remade, nothing is relinked"
    return ""


def _judge(runner: Runner, stage: Stage, records: Records) -> Verdict:
    if stage.name in runner.options.force:
        return Verdict(stage.name, "yes", ("--force",))
    parts, _key, entry = runner.probe(stage)
    if parts is None:
        reason = "its key is known only by running it (an in-memory module is traced on every compile)"
        return Verdict(stage.name, "yes", (reason,))
    if entry is not None:
        runner.entries[stage.name] = entry
        return Verdict(stage.name, "no", ("cached",))
    last = records.get("parts", f"{runner.id}/{stage.name}")
    if last is None:
        return Verdict(stage.name, "yes", ("never compiled with this cache",))
    reasons = diff_parts(last, parts) or ["the cache entry for this key is gone"]
    return Verdict(stage.name, "yes", tuple(reasons))
