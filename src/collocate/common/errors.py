"""The exception hierarchy.

Every error a user can cause carries the next step in its message, so the CLI can print it
as-is and exit non-zero instead of showing a traceback.
"""

from __future__ import annotations

import errno


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


def address_error(address: tuple[str, int], exc: OSError, option: str) -> CollocateError:
    """The error for a listener that cannot bind ``address``: in use, or not this machine's."""
    host, port = address
    if exc.errno == errno.EADDRINUSE:
        return CollocateError(f"port {port} is in use on {host}: another program (or another "
                              "collocate daemon) listens there",
                              hint=f"pick another port for {option}, or stop what listens there "
                                   f"(`ss -ltnp 'sport = :{port}'` names it)")
    return CollocateError(f"cannot listen on {host}:{port} ({option}): {exc.strerror or exc}",
                          hint="give an address of this machine, e.g. 127.0.0.1:PORT or 0.0.0.0:PORT")
