"""The daemon's log lines, made safe to print (``safetext.printable``); apart from ``safetext``
so that the client, which prints through ``printable`` too, need not import ``logging``."""

from __future__ import annotations

import logging

from collocate.common.safetext import printable


class PrintableLogFormatter(logging.Formatter):
    """Log lines whose message is ``printable``: a job name or reason with a newline or an escape
    sequence cannot forge a log line or reach the terminal of whoever reads ``daemon.log``.
    Tracebacks keep their lines (they come from the daemon's code, not from users)."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 (logging's name)
        record.message = printable(record.message)
        return super().formatMessage(record)
