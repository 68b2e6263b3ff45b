"""kiln's runtime objects: a cache item of the link stage, keyed by the runtime's sources, the
compiler and torch, so it is built once per machine, not once per model.

Usage: python -m tasks.link.runtime STORE_ROOT CODE  (CODE: this module's code digest)
Builds the item if the store lacks it; exits 0 if it built it, 3 if it found it built.

Note: the item depends on no model, so it need not wait for link. On a cold cache the runner
starts this module when the compile's first stage runs (pipeline/prebuild.py), and the runtime
compiles beside trace, which leaves cores idle; link then finds the item, or waits on its key
lock while it is being built, and never builds it twice. A link that finds no item being built
builds it itself.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from cache.hashing import digest_json
from cache.items import ItemCache
from cache.store import Entry, Store
from contract.facts import env_fact
from contract.toolchain import RUNTIME_FLAGS
from tasks.codegen.cpp_build import RUNTIME, compiler, run_compiler, torch_include

STAGE = "link"  # the stage whose item namespace holds the runtime
WHAT = "runtime"  # what pipeline/prebuild.py says it built ahead
UNITS = ("kiln_runtime.cpp", "kiln_cuda.cpp", "kiln_replay.cpp")
BOXED_UNIT = "kiln_boxed.cpp"  # kiln's boxed call, against ATen: only for models that call it
# Note: ATen's headers want C++20 (torch 2.13's use default member initializers on bit-fields).
BOXED_FLAGS = ("-std=c++20", *(f for f in RUNTIME_FLAGS if not f.startswith("-std=")))


def runtime_parts(cxx: str, env: Mapping[str, str], code: str) -> dict[str, str]:
    """The item's key parts; env holds the "cxx" and "torch" facts (contract.facts), code the
    digest of this module's code closure (the runner's code() for link)."""
    # Note: this module's closure holds every file of runtime/ (it compiles with -I runtime/,
    # so any header there may be read) and the flags it compiles with: pipeline.codedeps finds
    # them. It is the same for both targets, so one machine builds the runtime once.
    return {"code": code,
            "flags": digest_json([Path(cxx).name, *RUNTIME_FLAGS]), "cxx": env.get("cxx", ""),
            "torch": env.get("torch", "")}


def machine_env() -> dict[str, str]:
    """The facts runtime_parts reads, as link's job gets them (both are target-independent)."""
    return {fact: env_fact(fact, "cpu") for fact in ("cxx", "torch")}


def runtime_objects(items: ItemCache, cxx: str, env: Mapping[str, str],
                    code: str) -> tuple[list[Path], Entry, bool]:
    """The runtime's objects, their item and whether it was cached; built here if missing."""

    def compile_unit(unit: str, out: Path) -> None:
        run_compiler([cxx, *RUNTIME_FLAGS, f"-I{torch_include()}", "-I.", "-c", unit,
                      "-o", str(out / unit.replace(".cpp", ".o"))], cwd=RUNTIME)

    def compute(out: Path) -> dict[str, Any]:
        # Note: the units compile side by side: on a cold cache the runtime is the longest part
        # of the link.
        with ThreadPoolExecutor(max_workers=len(UNITS)) as pool:
            for done in [pool.submit(compile_unit, unit, out) for unit in UNITS]:
                done.result()
        return {}

    item, hit = items.get_or_compute(runtime_parts(cxx, env, code), compute)
    return [item.file(unit.replace(".cpp", ".o")) for unit in UNITS], item, hit


def boxed_object(items: ItemCache, cxx: str, env: Mapping[str, str], code: str) -> tuple[Path, Entry, bool]:
    """kiln_boxed.cpp's object (runtime/kiln_boxed.h), an item of its own: it includes ATen, so
    it takes seconds to build, once per machine, and only for a model with a boxed call."""

    def compute(out: Path) -> dict[str, Any]:
        run_compiler([cxx, *BOXED_FLAGS, f"-I{torch_include()}", "-I.", "-c", BOXED_UNIT,
                      "-o", str(out / BOXED_UNIT.replace(".cpp", ".o"))], cwd=RUNTIME)
        return {}

    flags = digest_json([Path(cxx).name, *BOXED_FLAGS])
    parts = runtime_parts(cxx, env, code) | {"unit": BOXED_UNIT, "flags": flags}
    item, hit = items.get_or_compute(parts, compute)
    return item.file(BOXED_UNIT.replace(".cpp", ".o")), item, hit


def is_cached(store: Store, code: str) -> bool:
    return ItemCache(store, STAGE).lookup(runtime_parts(compiler(), machine_env(), code)) is not None


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    _, _, hit = runtime_objects(ItemCache(Store(Path(argv[0])), STAGE), compiler(), machine_env(), argv[1])
    return 3 if hit else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
