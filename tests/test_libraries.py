"""The libraries a stage's worker imports, told to a worker waiting for a later stage
(contract/libraries.py), so that weights' worker imports the model's libraries while trace runs."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from pathlib import Path

from contract.libraries import import_shared
from pipeline.build import Cache, compile_model
from pipeline.runner import BuildOptions
from tests.conftest import write_config
from tests.fake_library_stages import LIBRARY_STAGES


def test_a_block_lists_the_libraries_it_imports_and_never_the_models_own_files(tmp_path: Path) -> None:
    (tmp_path / "own_model_file.py").write_text("import colorsys\n")
    listed = tmp_path / "libraries"
    code = f"""
        import sys
        sys.path.insert(0, {str(tmp_path)!r})
        import wave  # before the block: not listed
        from contract.libraries import shared_while
        with shared_while({str(listed)!r}):
            import own_model_file
            import json.tool
    """
    subprocess.run([sys.executable, "-c", textwrap.dedent(code)], check=True)
    names = listed.read_text().split()
    assert "colorsys" in names
    assert "json.tool" in names
    assert "own_model_file" not in names
    assert "wave" not in names


def test_listed_libraries_are_imported_until_the_job_comes_and_a_failure_says_so(tmp_path: Path) -> None:
    listed = tmp_path / "libraries"
    listed.write_text("colorsys\nnot a name\n")
    came = threading.Event()
    threading.Timer(0.3, came.set).start()
    assert import_shared(listed, came.is_set)
    assert "colorsys" in sys.modules
    listed.write_text("no_such_library_kiln_test\n")
    assert not import_shared(listed, lambda: False)


def test_a_waiting_worker_imports_what_the_stage_before_it_listed(project: Path, cache: Cache) -> None:
    from contract.config import load_config

    config = load_config(str(write_config(project, "fake")))
    result = compile_model(config, BuildOptions("cpu", project / "build"), cache, stages=LIBRARY_STAGES)
    assert result.entries["takes"].file("takes.txt").read_text() == "True\n"
    # what the worker and the stage import themselves does not hold it
    code = "import sys, pipeline.worker, tests.fake_library_stages as s; print(s.LIBRARY in sys.modules)"
    alone = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    assert alone.stdout == "False\n"
