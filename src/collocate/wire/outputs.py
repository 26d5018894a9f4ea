"""``submit --output/--error PATH``: where a job's output goes besides ``collocate logs``, named
as ``sbatch -o/-e`` name it.

A path is a pattern: ``%j`` is the job's id, ``%x`` its name, ``%u`` its user, ``%A`` its
sweep's id (the sweep's first job; a job outside a sweep: its own id), ``%%`` a ``%``.
``collocate submit --sweep`` fills ``%a`` (the sweep's index: the value of its only axis) and the
``{NAME}`` placeholders before the daemon sees the path (``client/sweep.py``). A relative path
is relative to the job's working directory, as sbatch's is; it is made absolute when the job is
submitted. The file is opened and written by a process of the job's user (``node/runner.py``),
never by root: a member can make the daemon write only where they could write themselves.
"""

from __future__ import annotations

import os
import re

from collocate.common.errors import InputError

#: What the daemon fills in: letter -> what it stands for (said in errors).
LETTERS = {"j": "the job id", "x": "the job name", "u": "the user name", "A": "the sweep's id",
           "%": "a %"}
PERCENT = re.compile(r"%(.?)", re.DOTALL)  # a pattern letter, or a lone % at the end
MAX_PATH = 4096


def check_template(template: object, option: str, cwd: str) -> str | None:
    """``template`` in form (only ``LETTERS`` after a ``%``), made absolute against ``cwd``;
    None for none given."""
    if template in (None, ""):
        return None
    if not isinstance(template, str) or "\0" in template or len(template) > MAX_PATH:
        raise InputError(f"{option} takes a file path, got {template!r}", hint=f"e.g. {option} out-%j.txt")
    for m in PERCENT.finditer(template):
        if m[1] not in LETTERS:
            if m[1] == "a":
                hint = "%a is a sweep's index: give --sweep with one axis, or write {NAME} for an axis"
            else:
                hint = "write " + ", ".join(f"%{k} ({v})" for k, v in LETTERS.items())
            raise InputError(f"{option} {template!r}: {'%' + m[1]!r} is not a pattern collocate fills",
                             hint=hint)
    if template.endswith("/"):
        raise InputError(f"{option} {template!r} names a directory", hint=f"name a file: {option} {template}%j.out")
    return os.path.join(cwd, template)


def check_directory(template: str | None, option: str, cwd: str) -> None:
    """Refuse, at submission, an ``--output``/``--error`` whose directory does not exist (one
    named without a pattern). Why: the job could not open its file and would fail when it
    starts, perhaps hours later in the queue (sbatch's job fails the same way, silently). The
    client checks, as its member, where it checks ``--cwd``; a directory with a ``%`` pattern
    is known only once the job has its id, and is left to the job."""
    if not template:
        return
    parent = os.path.dirname(os.path.join(cwd, template))
    if "%" in parent or os.path.isdir(parent):
        return
    import shlex

    raise InputError(f"{option} {template}: the directory {parent} does not exist",
                     hint=f"create it first (mkdir -p {shlex.quote(parent)}); the job would fail "
                     "when it starts, as it does under sbatch")


def fill(template: str, *, job_id: str, name: str, user: str, sweep: str) -> str:
    """The path ``template`` names for one job (checked by ``check_template``)."""
    values = {"j": job_id, "x": name, "u": user, "A": sweep or job_id, "%": "%"}
    return PERCENT.sub(lambda m: values.get(m[1], m[0]), template)


def escape(value: str) -> str:
    """``value`` as literal text in a template (a sweep value with a ``%``)."""
    return value.replace("%", "%%")
