"""What the runner tells a display while stages run (Display), and the quiet one; the CLI's
live display is cli/progress.py."""

from __future__ import annotations

from typing import Protocol

from rich.console import Console


class Display(Protocol):
    def started(self, stage: str) -> None: ...

    def finished(self, stage: str, status: str, seconds: float) -> None: ...

    def waiting(self, stage: str) -> None: ...

    def progress(self, stage: str, done: int, total: int, what: str) -> None: ...

    def warn(self, message: str) -> None: ...


class QuietDisplay:
    """No live output; warnings still go to stderr."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console(stderr=True)

    def started(self, stage: str) -> None:
        pass

    def finished(self, stage: str, status: str, seconds: float) -> None:
        pass

    def progress(self, stage: str, done: int, total: int, what: str) -> None:
        pass

    def waiting(self, stage: str) -> None:
        self.console.print(f"[yellow]{stage}: another compile holds this key; waiting[/]")

    def warn(self, message: str) -> None:
        self.console.print(f"[yellow]warning:[/] {message}")
