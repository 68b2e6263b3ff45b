"""The libraries a stage's worker imports, told to a worker waiting for a later stage
(contract/libraries.py), so that weights' worker imports the model's libraries while trace runs."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from pipeline.build import Cache, compile_model
from pipeline.runner import BuildOptions
from tests.conftest import write_config
from tests.fake_library_stages import LIBRARY_STAGES


def _run(code: str, tmp_path: Path) -> None:
    """Run code in a fresh Python whose library folder is tmp_path/lib (and the model's own files
    in tmp_path/own), so the modules it imports were imported by nothing before."""
    (tmp_path / "lib").mkdir(exist_ok=True)
    (tmp_path / "own").mkdir(exist_ok=True)
    prelude = f"""
        import os, sys, time
        sys.path[:0] = [{str(tmp_path / "lib")!r}, {str(tmp_path / "own")!r}]
        import contract.libraries as libraries
        libraries.library_folders = lambda: ({str(tmp_path / "lib")!r} + os.sep,)
    """
    subprocess.run([sys.executable, "-c", textwrap.dedent(prelude) + textwrap.dedent(code)], check=True,
                   timeout=60)


def test_a_block_lists_the_libraries_it_imports_as_it_goes_and_never_the_models_own_files(
        tmp_path: Path) -> None:
    (tmp_path / "lib").mkdir()
    (tmp_path / "own").mkdir()
    for name in ("before", "first", "second"):
        (tmp_path / "lib" / f"{name}.py").write_text("")
    (tmp_path / "own" / "model_file.py").write_text("import second\n")
    listed = tmp_path / "libraries"
    _run(f"""
        import before
        with libraries.shared_while({str(listed)!r}):
            import first
            time.sleep(10 * libraries.POLL_S)
            assert open({str(listed)!r}).read().split() == ["first"]  # told while the block runs
            import model_file
    """, tmp_path)
    assert listed.read_text().split() == ["first", "second"]


def test_listed_libraries_are_imported_until_the_job_comes_and_a_failure_says_so(tmp_path: Path) -> None:
    (tmp_path / "lib").mkdir()
    for name in ("taken", "late"):
        (tmp_path / "lib" / f"{name}.py").write_text("")
    (tmp_path / "lib" / "broken.py").write_text("raise RuntimeError('no')\n")
    listed = tmp_path / "libraries"
    listed.write_text("taken\nnot a name\n")
    _run(f"""
        from pathlib import Path
        listed = Path({str(listed)!r})
        start = time.monotonic()
        assert libraries.import_shared(listed, lambda: time.monotonic() - start > 0.3)
        assert "taken" in sys.modules
        listed.write_text("late\\n")
        assert libraries.import_shared(listed, lambda: True)  # the job came: nothing more
        assert "late" not in sys.modules
        listed.write_text("broken\\n")
        assert not libraries.import_shared(listed, lambda: False)
    """, tmp_path)


def test_a_library_that_draws_from_torchs_generator_at_import_is_not_imported_ahead(tmp_path: Path) -> None:
    """Imported ahead, its draw comes before the model's seed where a fresh worker's comes after:
    the warm worker would build other weights, so it starts afresh instead."""
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "quiet.py").write_text("import torch\n")
    (tmp_path / "lib" / "draws.py").write_text("import torch\nNOISE = torch.rand(1)\n")
    listed = tmp_path / "libraries"
    listed.write_text("quiet\ndraws\n")
    _run(f"""
        import torch
        from pathlib import Path
        assert not libraries.import_shared(Path({str(listed)!r}), lambda: False)
        assert "quiet" in sys.modules
    """, tmp_path)


def test_a_waiting_worker_imports_what_the_stage_before_it_listed(project: Path, cache: Cache) -> None:
    from contract.config import load_config

    config = load_config(str(write_config(project, "fake")))
    result = compile_model(config, BuildOptions("cpu", project / "build"), cache, stages=LIBRARY_STAGES)
    assert result.entries["takes"].file("takes.txt").read_text() == "True\n"
    # what the worker and the stage import themselves does not hold it
    code = "import sys, pipeline.worker, tests.fake_library_stages as s; print(s.LIBRARY in sys.modules)"
    alone = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    assert alone.stdout == "False\n"
