"""Small stand-in stages for testing the runner itself (keys, cutoff, force, locks).

Each writes a file derived from its inputs; `scale` is read by the first stage, and the
output only depends on whether scale is positive, so changing 2 -> 3 reruns `first` but
leaves its output identical: the shape early cutoff needs."""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from contract.job import StageJob
from pipeline.stages import Stage


def first(job: StageJob) -> Mapping[str, Any]:
    kwargs = job.config["model.kwargs"]
    sign = "positive" if kwargs.get("scale", 1) > 0 else "negative"
    (job.out_dir / "first.txt").write_text(sign + "\n")
    _count(job)
    if kwargs.get("sleep"):
        time.sleep(float(kwargs["sleep"]))
    return {"sign": sign}


def second(job: StageJob) -> Mapping[str, Any]:
    text = job.input("first/first.txt").read_text()
    (job.out_dir / "second.txt").write_text(text.upper())
    _count(job)
    return {}


def third(job: StageJob) -> Mapping[str, Any]:
    text = job.input("second/second.txt").read_text()
    items = job.items()
    for i, word in enumerate(text.split()):
        items.get_or_compute({"word": word, "i": str(i)}, functools.partial(_item, word=word))
    (job.out_dir / "third.txt").write_text(text[::-1])
    _count(job)
    return {}


def _item(folder: Path, *, word: str) -> Mapping[str, Any]:
    (folder / "item.txt").write_text(word)
    return {"word": word}


def _count(job: StageJob) -> None:
    """Append the stage's name to a log so tests can count how often each stage ran; die at
    once, as a native crash would, in the stage KILN_TEST_CRASH names."""
    if os.environ.get("KILN_TEST_CRASH") == job.stage:
        os._exit(7)
    log = os.environ.get("KILN_TEST_RUNLOG")
    if log:
        with Path(log).open("a") as f:
            f.write(f"{job.stage}\n")


def aside(job: StageJob) -> Mapping[str, Any]:
    """Read by no later stage (as weights is): the runner runs it beside them. Sleeps long
    enough that the stages after it start while it runs."""
    text = job.input("first/first.txt").read_text()
    _count(job)
    time.sleep(1.5)
    if os.environ.get("KILN_TEST_FAIL") == job.stage:
        raise ValueError("aside failed on purpose")
    (job.out_dir / "aside.txt").write_text(text.strip() + " aside\n")
    return {}


FAKE_STAGES: tuple[Stage, ...] = (
    Stage("first", "", config=("model.kwargs",),
          entry="tests.fake_stages:first", publish=("first.txt",)),
    Stage("second", "", reads=("first/first.txt",),
          entry="tests.fake_stages:second"),
    Stage("third", "", reads=("second/second.txt",),
          entry="tests.fake_stages:third"),
    Stage("fourth", "", reads=("third/third.txt",), planned="a later issue"),
)


# The same, with a stage beside the chain after the first (as weights is after trace).
STAGES_WITH_ASIDE: tuple[Stage, ...] = (
    FAKE_STAGES[0],
    Stage("aside", "", reads=("first/first.txt",), entry="tests.fake_stages:aside", publish=("aside.txt",)),
    *FAKE_STAGES[1:3],
)


def consume(job: StageJob) -> Mapping[str, Any]:
    """Reads trace's program: stands in for `lower` until it exists."""
    data = job.input("trace/program.json").read_bytes()
    (job.out_dir / "consumed.txt").write_text(str(len(data)))
    _count(job)
    return {}


def with_consumer(stages: tuple[Stage, ...]) -> tuple[Stage, ...]:
    consumer = Stage("consume", "", reads=("trace/program.json",),
                     entry="tests.fake_stages:consume")
    return (stages[0], stages[1], consumer)  # trace, weights, and the consumer
