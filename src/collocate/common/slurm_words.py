"""Slurm's options that collocate spells otherwise, for the error a Slurm user meets first.

Why: a member types ``--job-name=x`` or ``#COLLOCATE --gres=gpu:1`` from habit; Click's "No
such option" then guesses by spelling (``--gres``: "--gpus, --nodes, --retries?"). This says
what to write instead, as docs/slurm.md does, so the error is the lesson. Options collocate
takes under Slurm's own name (``-J``, ``-t``, ``-o``, ``--time``, ``--nice``, ...) are not here.
"""

from __future__ import annotations

#: A Slurm option (long or short) -> what collocate takes for it.
INSTEAD = {
    "--job-name": "-J NAME or --name NAME",
    "--gres": "--gpus N",
    "--gpus-per-node": "--gpus N",
    "--mem-per-gpu": "--mem SIZE (GPU memory, with a unit: 8GiB)",
    "--dependency": "--after N (afterok), --after-any N (afterany) or --after-notok N (afternotok)",
    "-d": "--after N (afterok), --after-any N (afterany) or --after-notok N (afternotok)",
    "--chdir": "--cwd DIR",
    "-D": "--cwd DIR",
    "--export": "--env NAME=VALUE (repeatable); the job gets your environment already",
    "--array": "--sweep i=0..9 (then {i} in the command), and --sweep-max N for %N",
    "-a": "--sweep i=0..9 (then {i} in the command), and --sweep-max N for %N",
    "--mail-type": "--notify CMD (a command run as you when the job ends)",
    "--mail-user": "--notify CMD (a command run as you when the job ends)",
    "--partition": "nothing: a server has one queue (no partitions)",
    "-p": "nothing: a server has one queue (no partitions)",
    "--account": "nothing: fair share per user replaces accounts",
    "-A": "nothing: fair share per user replaces accounts",
    "--qos": "--nice N to lower your job; raising it is the admin's `collocate priority`",
    "--wrap": "the command after --: collocate submit -- CMD",
    "--parsable": "nothing: submit prints the id alone",
    "--exclusive": "nothing per job: a GPU of your own is a policy the admin sets (exclusive)",
    "--starttime": "-S or --since",
    "--endtime": "-E or --until",
}


def instead(option: str | None, known: set[str] | None = None) -> str | None:
    """The hint for Slurm's ``option`` (``--gres`` or ``--gres=gpu:1``), or None; with
    ``known`` (the command's own option names), None where it names none of them (``run``
    takes no ``--after``: its plain hint is truer)."""
    import re

    if not option:
        return None
    name = option.split("=", 1)[0]
    what = INSTEAD.get(name)
    if what is None:
        return None
    named = re.findall(r"(?<![\w-])-{1,2}[a-zA-Z][\w-]*", what)
    if known is not None and named and not set(named) & known:
        return None
    if what.startswith("nothing"):
        return f"{name} is Slurm's and not needed here: {what.split(': ', 1)[1]}; leave it out"
    return f"{name} is Slurm's; here write {what} (docs/slurm.md maps each)"


def hint_for(exc: BaseException) -> str | None:
    """``instead`` for Click's "No such option" ``exc``, checked against its command's options."""
    ctx = getattr(exc, "ctx", None)
    command = getattr(ctx, "command", None)
    known = None if command is None else {o for p in command.params for o in getattr(p, "opts", ())}
    return instead(getattr(exc, "option_name", None), known)
