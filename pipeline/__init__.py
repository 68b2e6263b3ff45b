"""kiln's pipeline: the stage table, the runner, reports and the CLI.

`from pipeline import compile, load` is the Python surface (DESIGN §1b). Importing this
package stays cheap: nothing here imports torch until a stage needs it.
"""

from __future__ import annotations

from typing import Any


def compile(model: Any, example_inputs: tuple[Any, ...], **kwargs: Any) -> Any:
    from pipeline.api import compile as _compile

    return _compile(model, example_inputs, **kwargs)


def load(build_dir: Any) -> Any:
    from pipeline.api import load as _load

    return _load(build_dir)


__all__ = ["compile", "load"]
