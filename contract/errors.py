"""The one exception type users see: a short message and, where there is one, what to do."""

from __future__ import annotations


class KilnError(Exception):
    """A failure with a clear cause. The CLI prints it without a traceback (unless --debug)."""

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.detail = ""  # traceback or log tail, shown with --debug

    def with_detail(self, detail: str) -> KilnError:
        self.detail = detail
        return self

    def __str__(self) -> str:
        return f"{self.message}\n  hint: {self.hint}" if self.hint else self.message

    def to_json(self) -> dict[str, str]:
        return {"message": self.message, "hint": self.hint}


class MissingPackage(KilnError):
    def __init__(self, package: str, model: str) -> None:
        super().__init__(
            f"model {model!r} needs the Python package {package!r}, which is not installed",
            f"install it into kiln's environment: .venv/bin/pip install {package}"
            + (" (the release built for your torch)" if package.startswith("torch") else ""),
        )
