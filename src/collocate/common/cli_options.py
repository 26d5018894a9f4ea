"""Options several areas' commands share (the daemon's ``serve`` and the client commands,
``submit`` and ``run``), declared without Typer (``cli_params``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from collocate.common.cli_params import Option

StateDirOpt = Annotated[
    Path | None,
    # readable=False: a --group member may enter the state dir (0710) but not list it, and the
    # daemon's socket is all a client needs there
    Option("--state-dir", readable=False, help="Daemon state dir (default: "
                 "$COLLOCATE_STATE_DIR, then $XDG_STATE_HOME/collocate, then ~/.local/state/collocate)."),
]

HostOpt = Annotated[
    str | None,
    Option("--host", envvar="COLLOCATE_HOST", show_envvar=False,
                 help="The daemon's TCP API, HOST:PORT, instead of the state dir's socket "
                      "(default: $COLLOCATE_HOST)."),
]
TokenFileOpt = Annotated[
    Path | None,
    Option("--token-file", envvar="COLLOCATE_TOKEN_FILE", show_envvar=False,
                 help="With --host: the file holding your token (default: $COLLOCATE_TOKEN_FILE)."),
]
FingerprintOpt = Annotated[
    str | None,
    Option("--fingerprint", envvar="COLLOCATE_FINGERPRINT", show_envvar=False,
                 help="With --host: the SHA-256 fingerprint of the daemon's TLS certificate, as "
                      "`collocate serve --tls` printed it (default: $COLLOCATE_FINGERPRINT)."),
]

OutputOpt = Annotated[str | None, Option("--output", "-o", help="Also write the job's "
                      "stdout (and stderr, without --error) to this file, as sbatch -o: %j is the "
                      "job id, %x its name, %u your user name, %A the sweep's id, %a its index (a "
                      "sweep of one axis), %% a %. Relative to --cwd; created and written as you. "
                      "A retry appends under a header line.")]
ErrorOpt = Annotated[str | None, Option("--error", "-e", help="Also write the job's stderr "
                     "to this file (the patterns of --output).")]
