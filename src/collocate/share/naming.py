"""Where a producer can be found: one name, one state directory, one abstract socket address.

Producers listen on a Linux *abstract* Unix socket, so nothing is ever created in the file system
and nothing can be left behind when a process is killed (the kernel drops the name with the last
descriptor). The ring itself is an anonymous ``memfd`` handed to consumers over that socket, so
``/dev/shm`` is never touched either. The state directory only scopes names: two daemons with
different state directories (or two users) never see each other's producers.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
from pathlib import Path

from collocate.common.errors import InputError
from collocate.share.errors import ShareUnsupportedError

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def check_platform() -> None:
    """Fail early and clearly where the transport cannot work."""
    if not sys.platform.startswith("linux") or not hasattr(os, "memfd_create"):
        raise ShareUnsupportedError(
            f"shared data loading needs Linux (memfd and abstract Unix sockets); this is {sys.platform}",
            hint="run the producer and its consumers on a Linux host, or use a plain DataLoader",
        )


def validate_name(name: str) -> str:
    """A dataset name: 1-64 characters of letters, digits, '.', '_' or '-'."""
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise InputError(
            f"invalid shared dataset name {name!r}",
            hint="use 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit",
        )
    return name


def default_state_dir() -> Path:
    """Per-user default: ``$XDG_RUNTIME_DIR/collocate`` or ``<tmp>/collocate-<uid>``."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        return Path(runtime) / "collocate"
    import tempfile

    return Path(tempfile.gettempdir()) / f"collocate-{os.getuid()}"


def socket_address(name: str, state_dir: str | os.PathLike[str] | None = None) -> str:
    """The abstract socket address (leading NUL) for ``name`` under ``state_dir``.

    The directory is only hashed, never created: the address is a pure function of
    (uid, resolved state dir, name), which is what the daemon needs to find a producer it started.
    """
    validate_name(name)
    root = Path(state_dir) if state_dir is not None else default_state_dir()
    digest = hashlib.sha256(str(root.expanduser().resolve()).encode()).hexdigest()[:16]
    return f"\0collocate/share/{os.getuid()}/{digest}/{name}"


def address_is_bound(address: str) -> bool:
    """Whether an abstract socket with this address exists (reads ``/proc/net/unix``)."""
    wanted = "@" + address[1:]
    try:
        with open("/proc/net/unix", encoding="utf-8", errors="replace") as fh:
            return any(line.rstrip("\n").endswith(" " + wanted) for line in fh)
    except OSError:
        return False
