"""docs/multi-node.md's systemd units (scripts/multi-node/): the Ray head, the Ray workers and
the collocate head run the set-up's own commands, with the token and a private temp dir, keep
jobs alive when Ray or the head stops (KillMode=process), start in order, and every option of
the head's command line is one `collocate serve` takes."""

from __future__ import annotations

import configparser
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
UNITS = ROOT / "scripts" / "multi-node"


def unit(name: str) -> configparser.SectionProxy:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # systemd keys are case-sensitive
    assert parser.read(UNITS / name), name
    return parser["Service"]


def argv(service: configparser.SectionProxy) -> list[str]:
    return shlex.split(service["ExecStart"])  # systemd quotes as a POSIX shell does here


def env_file() -> dict[str, str]:
    lines = (UNITS / "collocate-ray.env").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))


@pytest.mark.parametrize("name", ["collocate-ray-head.service", "collocate-ray-worker.service",
                                  "collocate-head.service"])
def test_every_unit_keeps_jobs_and_reads_the_token(name):
    service = unit(name)
    assert service["KillMode"] == "process"  # systemd's default would kill the jobs too
    assert service["EnvironmentFile"] == "/etc/collocate-ray.env"
    env = env_file()
    assert env["RAY_AUTH_MODE"] == "token" and env["RAY_AUTH_TOKEN_PATH"].startswith("/etc/")
    for var in re.findall(r"\$\{(\w+)\}", service["ExecStart"]):
        assert var in env, var
    assert name in (ROOT / "docs" / "multi-node.md").read_text()


def test_the_ray_units_run_the_set_ups_commands():
    head, worker = argv(unit("collocate-ray-head.service")), argv(unit("collocate-ray-worker.service"))
    for cmd in (head, worker):
        assert cmd[1:3] == ["start", "--block"]  # in the foreground, as systemd wants it
        assert cmd[cmd.index("--num-gpus") + 1] == "0"  # collocate keeps its own GPU accounting
        assert cmd[cmd.index("--resources") + 1] == '{"collocate": 1}'
        assert cmd[cmd.index("--labels") + 1] == "collocate-node=${COLLOCATE_NODE}"
    assert "--head" in head and head[head.index("--temp-dir") + 1].startswith("/var/lib/collocate-ray/")
    assert "/var/lib/collocate-ray" in unit("collocate-ray-head.service")["ExecStartPre"]
    assert worker[worker.index("--address") + 1] == "${RAY_HEAD}:6379"
    doc = (ROOT / "docs" / "multi-node.md").read_text()
    assert "--resources '{\"collocate\": 1}'" in doc and "--num-gpus 0" in doc


def test_the_head_unit_starts_after_ray_with_options_serve_takes():
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str
    parser.read(UNITS / "collocate-head.service")
    assert parser["Unit"]["After"] == "collocate-ray-head.service"
    assert parser["Unit"]["Requires"] == "collocate-ray-head.service"
    cmd = argv(parser["Service"])
    assert cmd[1:4] == ["serve", "--ray", "auto"]
    helped = subprocess.run([sys.executable, "-m", "collocate.daemon", "serve", "--help"],
                            capture_output=True, text=True, timeout=60, check=True,
                            env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"}).stdout
    for option in (a for a in cmd[1:] if a.startswith("--")):
        assert option in helped, option
