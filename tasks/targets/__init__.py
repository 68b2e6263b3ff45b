"""Targets as backends. Each target is a package here (cpu, cuda) that supplies, for every
stage whose work depends on the target, that stage's entry, the way each of Triton's backends
adds its own stages:

    kernels.py   gen-tuning-code   every kernel's variants as sources, kernels.json, tune.py
    autotune.py  autotune          the variants timed (tune.py, standalone) and the winners built
    launch.py    gen-cpp           how the wrapper launches a kernel (a Launcher)
    link.py      link              the objects that hold the kernels

Each `run(job)` hands its target's part to the stage's shared body (tasks/gen_tuning/stage.py,
tasks/gen_cpp/stage.py, tasks/link/stage.py); autotune is the target's own. The stage table
names them by a template (`tasks.targets.{target}.autotune:run`), so a stage imports nothing of
another target, no stage code branches on the target's name, and each stage's key holds only
its own target's code: an edit of the cuda launcher reruns no cpu build.
"""

TARGETS = ("cpu", "cuda")
MODULES = {"gen-tuning-code": "kernels", "autotune": "autotune", "gen-cpp": "launch", "link": "link"}
