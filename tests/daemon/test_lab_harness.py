"""The lab's tests pass in any clone (issue 36, 18): where members cannot enter the checkout or
the venv (a clone in a 0700 home, a ``mktemp -d``), ``lab_harness`` mirrors what they must import
into a folder they can, and a member's Python imports from the mirror."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from lab_harness import _reachable, lab_members, member_python, mirror, why_no_lab

pytestmark = pytest.mark.skipif(why_no_lab() is not None, reason=str(why_no_lab()))


def _import_as(member, path: str) -> subprocess.CompletedProcess:
    python, _ = member_python()
    return subprocess.run([python, "-c", "import probe_pkg; print(probe_pkg.WHERE)"], user=member.uid,
                          group=member.gid, env={"PYTHONPATH": path, "HOME": "/tmp"}, cwd="/tmp",
                          capture_output=True, text=True, timeout=60, check=False)


def test_a_folder_members_cannot_enter_is_mirrored_where_they_can():
    member = lab_members()[0]
    private, shared = Path(tempfile.mkdtemp()), Path(tempfile.mkdtemp())
    try:
        os.chmod(private, 0o700)  # as mktemp -d makes it, or a clone in a 0700 home
        (private / "probe_pkg").mkdir()
        (private / "probe_pkg" / "__init__.py").write_text("WHERE = 'the mirror'\n")
        assert not _reachable(str(private))
        assert "ModuleNotFoundError" in _import_as(member, str(private)).stderr
        os.chmod(shared, 0o755)
        seen = _import_as(member, mirror(str(private), shared / "0"))
        assert seen.returncode == 0 and seen.stdout.strip() == "the mirror", seen.stderr
    finally:
        shutil.rmtree(private, ignore_errors=True)
        shutil.rmtree(shared, ignore_errors=True)
