"""The exception hierarchy.

Every error a user can cause carries the next step in its message, so the CLI can print it
as-is and exit non-zero instead of showing a traceback.
"""

from __future__ import annotations


class CollocateError(Exception):
    """Base class: a problem the user can fix; ``hint`` says how."""

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint

    def __str__(self) -> str:
        base = super().__str__()
        return f"{base}\n  hint: {self.hint}" if self.hint else base


class InputError(CollocateError):
    """Bad input at the edge: a trace row, a CLI option, an API request."""


class UnknownNameError(InputError):
    """A name (policy, GPU type, estimator, backend...) that is not registered."""

    def __init__(self, kind: str, name: str, valid: list[str] | tuple[str, ...]) -> None:
        super().__init__(
            f"unknown {kind} {name!r}",
            hint=f"valid {kind} names: {', '.join(sorted(valid))}",
        )
        self.kind, self.name, self.valid = kind, name, tuple(valid)

