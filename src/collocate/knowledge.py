"""What is known of a job's solo activity before it runs: one rule for the daemon and simulator.

A new job's profile (``Job.profile``/``profile_source``) comes from, in order:

1. ``history``: the last measured solo profile of the same command (the daemon's signature, the
   simulator's ``Workload.command``);
2. ``similar``: the median (``activity.program_prior``) of the profiles of its program's
   ``PROGRAM_PRIOR_RUNS`` most recently measured commands (a sweep's other points). The limit
   keeps the prior about the program as it runs now, not as it ran months ago, and bounds the
   query; both worlds apply the same limit;
3. else nothing (``assumed``: the policy's default).

While jobs run, a pending job nobody has measured takes the median profile of its program's
running siblings that are measured alone, inferred from their GPU's readings, or known from
history (``sibling_priors``).

The knowledge lives in a ``ProfileStore``: the daemon's SQLite ``Store`` (kept across restarts),
or ``MemoryProfiles`` (the simulator: one run's worth).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from collocate.activity import program_prior
from collocate.model import Job, JobProfile

#: How many of a program's most recently measured commands its prior is the median of.
PROGRAM_PRIOR_RUNS = 20


class ProfileStore(Protocol):
    def command_profile(self, command: str) -> JobProfile | None:
        """The last measured solo profile of this command, if any."""
        ...

    def program_profiles(self, program: str, limit: int) -> list[JobProfile]:
        """The measured profiles of the program's ``limit`` most recent commands."""
        ...


class MemoryProfiles:
    """A ``ProfileStore`` in memory: command → (program, profile), most recent last."""

    def __init__(self) -> None:
        self._by_command: dict[str, tuple[str | None, JobProfile]] = {}

    def record(self, command: str, program: str | None, profile: JobProfile) -> None:
        self._by_command.pop(command, None)  # re-inserted: now the most recent
        self._by_command[command] = (program, profile)

    def command_profile(self, command: str) -> JobProfile | None:
        known = self._by_command.get(command)
        return None if known is None else known[1]

    def program_profiles(self, program: str, limit: int) -> list[JobProfile]:
        recent = [p for prog, p in reversed(self._by_command.values()) if prog == program]
        return recent[:limit]


class ProfileKnowledge:
    """The "history, else the program's prior" rule over a ``ProfileStore``."""

    def __init__(self, store: ProfileStore, *, recent: int = PROGRAM_PRIOR_RUNS) -> None:
        self.store, self.recent = store, recent

    def known(self, command: str | None, program: str | None, *,
              similar: bool = True) -> tuple[JobProfile | None, str]:
        """A new job's profile and its ``profile_source``; ``(None, "assumed")`` when nothing
        is known. ``similar=False`` consults the command's own history only."""
        if command is not None and (profile := self.store.command_profile(command)) is not None:
            return profile, "history"
        if similar and program is not None:
            prior = self.program_prior(program)
            if prior is not None:
                return prior, "similar"
        return None, "assumed"

    def program_prior(self, program: str) -> JobProfile | None:
        return program_prior(self.store.program_profiles(program, self.recent))


@dataclass(frozen=True, slots=True)
class Sibling:
    """A running job as ``sibling_priors`` sees it."""

    program: str | None
    profile: JobProfile  # what policies price it with now
    measured: bool  # measured alone, inferred from its GPU, or known from history


def sibling_priors(pending: Iterable[Job], running: Iterable[Sibling],
                   program_of: Callable[[str], str | None]) -> list[Job]:
    """Pending jobs nobody has measured, each with the median profile of its program's measured
    running siblings (``profile_source`` "similar"); jobs with no such sibling are left out."""
    live: dict[str, list[JobProfile]] = {}
    for s in running:
        if s.measured and s.program is not None:
            live.setdefault(s.program, []).append(s.profile)
    if not live:
        return []
    out = []
    for job in list(pending):
        if job.profile_source != "assumed":
            continue
        program = program_of(job.id)
        prior = program_prior(live.get(program, [])) if program is not None else None
        if prior is not None:
            out.append(job.evolve(profile=prior, profile_source="similar"))
    return out
