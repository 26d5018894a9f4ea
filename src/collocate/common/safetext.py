"""Text from users and jobs made safe to print on a terminal.

Job names, commands, working directories, user names, reasons and stderr tails come from whoever
submitted the job, and on a shared daemon (``--group``) every member's ``collocate ls`` prints
them. Written raw, an escape sequence in a name (``ESC ]0;...BEL`` retitles the window, ``ESC
[2J`` clears the screen, others rewrite what is on it or, on some terminals, answer back as if
typed) reaches everyone's terminal. So every renderer passes such text through ``printable``,
which shows control characters as visible escapes instead of sending them, and prints the result
as plain text, never as Rich markup (where ``[/]`` in a name is an error and ``[lr=0.1]`` vanishes).
"""

from __future__ import annotations

import re

# C0 controls, DEL, C1 controls (CSI is U+009B on terminals that read 8-bit controls), the
# Unicode line and paragraph separators, the bidirectional marks, overrides and isolates that
# reorder what a terminal shows, and lone surrogates (no terminal encoding can write one).
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069\ud800-\udfff]")
_NAMED = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _escape(match: re.Match[str]) -> str:
    ch = match[0]
    code = ord(ch)
    return _NAMED.get(ch) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


def printable(text: object, *, multiline: bool = False) -> str:
    """``text`` with every control character written as a visible escape (ESC as ``\\x1b``).

    ``multiline`` keeps newlines and tabs (an stderr tail printed as lines); a CRLF becomes a
    newline, and a lone carriage return, which would let a later line overwrite an earlier
    one, is still escaped.

    >>> printable("job\\x1b]0;pwned\\x07[lr=0.1]")
    'job\\\\x1b]0;pwned\\\\x07[lr=0.1]'
    >>> printable("line 1\\r\\nline 2\\tx", multiline=True)
    'line 1\\nline 2\\tx'
    """
    s = "" if text is None else str(text)
    if multiline:
        s = s.replace("\r\n", "\n")
        return _UNSAFE.sub(lambda m: m[0] if m[0] in "\n\t" else _escape(m), s)
    return _UNSAFE.sub(_escape, s)
