"""The live display while stages run: a spinner and a clock per running stage."""

from __future__ import annotations

from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn

from pipeline.progress import QuietDisplay


class LiveDisplay(QuietDisplay):
    """A transient rich progress display: one line per running stage."""

    def __init__(self, console: Console | None = None) -> None:
        super().__init__(console)
        self.bars = Progress(
            SpinnerColumn(),
            TextColumn("[bold]{task.description}"),
            BarColumn(bar_width=24),
            TimeElapsedColumn(),
            console=self.console,
            transient=True,
        )
        self.tasks: dict[str, TaskID] = {}

    def __enter__(self) -> LiveDisplay:
        self.bars.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.bars.stop()

    def started(self, stage: str) -> None:
        self.tasks[stage] = self.bars.add_task(f"{stage}: running", total=None)

    def progress(self, stage: str, done: int, total: int, what: str) -> None:
        """A long stage's count (autotune: kernels tuned of those to tune) fills its bar."""
        task = self.tasks.get(stage)
        if task is not None:
            self.bars.update(task, description=f"{stage}: {done}/{total} {what}", completed=done,
                                 total=total)

    def finished(self, stage: str, status: str, seconds: float) -> None:
        task = self.tasks.pop(stage, None)
        if task is not None:
            self.bars.remove_task(task)
        if status == "ran":
            self.bars.console.print(f"  [green]✓[/] {stage} ran in {seconds:.2f} s")
