"""The stage table: kiln's compile, declared once, in order.

Each stage is a pure function of what it declares here: the artifacts it reads from earlier
stages, the config fields it reads (an allow-list) and the environment facts it depends on.
The runner builds each stage's key from exactly these, so nothing else can silently join a key
(Inductor's deny-list of ~290 flags is the counter-example), plus the code the stage runs, which
is computed from its entry, never listed (pipeline/codedeps.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Stage:
    name: str
    summary: str
    reads: tuple[str, ...] = ()  # "stage/artifact" of earlier stages; their digests join the key
    config: tuple[str, ...] = ()  # dotted config fields the stage reads
    env: tuple[str, ...] = ()  # environment facts (see contract.facts)
    by_target: bool = False  # the build's target (cpu, cuda) is a part of the key
    # "module:function" running the stage; None: not built yet. A stage by target names its
    # target's entry with "{target}" (tasks/targets: each target supplies its own).
    entry: str | None = None
    keys: str | None = None  # "module" with key_parts()/remember() for dynamic key parts
    prebuild: str | None = None  # "module" building a model-independent item ahead (pipeline/prebuild.py)
    publish: tuple[str, ...] = ()  # artifacts copied into the build folder ("dir/" for a folder)
    targets: tuple[str, ...] = ("cpu", "cuda")  # the targets the stage is built for
    planned: str = ""  # for a stage, or a target of it, not built yet: where it is planned
    # the targets on which it times code on the host's cores: the stages beside the chain end
    # before it starts there
    measures: tuple[str, ...] = ()
    # It may build the model: its worker, started ahead, imports the libraries an earlier stage
    # listed while it built the model (contract/libraries.py).
    builds_model: bool = False
    upstream: tuple[str, ...] = field(default=(), init=False)

    def __post_init__(self) -> None:
        ups = tuple(dict.fromkeys(ref.split("/", 1)[0] for ref in self.reads))
        object.__setattr__(self, "upstream", ups)

    @property
    def built(self) -> bool:
        return self.entry is not None

    def built_for(self, target: str) -> bool:
        return self.built and target in self.targets

    def measures_on(self, target: str) -> bool:
        return target in self.measures

    def entry_for(self, target: str) -> str | None:
        """The entry that runs this stage for `target`."""
        return None if self.entry is None else self.entry.format(target=target)


# Note: weights.seed is trace's too: a model built for real (tasks/trace/fake.py says when) can
# bake a value of its init into the program (float(self.scale) becomes a constant).
TRACE_CONFIG = ("model.factory", "model.kwargs", "model.dtype", "inputs", "weights.seed")
WEIGHTS_CONFIG = ("model.factory", "model.kwargs", "model.dtype", "weights.seed", "weights.checkpoint")

STAGES: tuple[Stage, ...] = (
    Stage(
        "trace",
        "torch.export the model built without weights; write the program and the weights' manifest",
        config=TRACE_CONFIG,
        env=("python", "torch", "safetensors"),
        entry="tasks.trace.stage:run",
        keys="tasks.trace.keys",
    ),
    Stage(
        "weights",
        "the weights file: a checkpoint checked against the manifest, or the seeded init",
        reads=("trace/weights.json", "trace/constants.safetensors", "trace/sources.json"),
        config=WEIGHTS_CONFIG,
        env=("python", "torch", "safetensors"),
        entry="tasks.weights.stage:run",
        keys="tasks.weights.keys",
        publish=("weights.safetensors",),
        builds_model=True,
    ),
    Stage(
        "lower",
        "aten ops to kiln's loop-level IR",
        reads=("trace/program.json",),
        config=("lower.layout",),
        env=("python", "torch"),
        by_target=True,  # the layout (tasks/lower/layout.py)
        entry="tasks.lower.stage:run",
    ),
    Stage(
        "schedule",
        "fusion into kernel groups, launch order, buffer plan",
        reads=("lower/ir.json",),
        entry="tasks.schedule.stage:run",
    ),
    Stage(
        "gen-tuning-code",
        "one source file per kernel and a standalone tune.py",
        reads=("schedule/schedule.json",),
        config=("tuning.matmul",),
        env=("cxx", "isa", "triton"),
        by_target=True,
        entry="tasks.targets.{target}.kernels:run",
        publish=("tune.py", "kernels.json", "kernels/"),
    ),
    Stage(
        "autotune",
        "tune every kernel on random inputs; compile the winners",
        reads=("gen-tuning-code/kernels.json",),
        env=("cxx", "isa", "gpu", "arch", "ptxas", "triton", "torch"),
        by_target=True,
        entry="tasks.targets.{target}.autotune:run",
        publish=("timings.json",),
        # Note: cuda's timings are the GPU's alone: each timed launch is queued behind a sleep
        # kernel (tasks/targets/cuda/tune.py: seconds), so a weights stage busy on a host core
        # cannot skew them, and cuda's autotune starts without waiting for it (on bert, the
        # seconds of its model build). The cpu target times the host's own cores.
        measures=("cpu",),
    ),
    Stage(
        "gen-cpp",
        "the C++ wrapper that runs the schedule",
        reads=("schedule/schedule.json", "autotune/tuning.json", "lower/signature.json"),
        env=("isa",),
        by_target=True,
        entry="tasks.targets.{target}.launch:run",
        publish=("model.json",),
    ),
    Stage(
        "link",
        "model.so against kiln_model.h and torch's stable C shim",
        reads=("gen-cpp/wrapper.cpp", "autotune/tuning.json"),
        env=("cxx", "torch", "isa"),
        by_target=True,
        entry="tasks.targets.{target}.link:run",
        prebuild="tasks.link.runtime",
        publish=("model.so", "kiln_model.h"),
    ),
)


def check_table(stages: tuple[Stage, ...]) -> None:
    """Every stage reads only from stages before it, and names are unique."""
    seen: set[str] = set()
    for stage in stages:
        if stage.name in seen:
            raise ValueError(f"stage {stage.name!r} declared twice")
        missing = [up for up in stage.upstream if up not in seen]
        if missing:
            raise ValueError(f"stage {stage.name!r} reads from later or unknown {missing}")
        seen.add(stage.name)


def stage_names(stages: tuple[Stage, ...] = STAGES) -> list[str]:
    return [s.name for s in stages]


check_table(STAGES)
