"""How Ray's token authentication behaves, checked on a throwaway local cluster.

    python benchmarks/ray_auth_check.py --ray-python VENV/bin/python

With the Ray of ``--ray-python`` (``ray[default]`` for the dashboard checks), in a private HOME so
no real ``~/.ray`` is read or written: makes a token with ``ray get-auth-token --generate``,
starts a head with ``RAY_AUTH_MODE=token`` and the dashboard, then tries, each as a fresh
process: a driver with the token, without it, with a wrong one; a worker node joining without
and with it; ``ray status``; the dashboard's HTTP API without and with the token; and lists the
TCP ports the cluster listens on. The cluster's processes carry a marker variable and are
killed by pid at the end (never ``ray stop``, which stops every Ray cluster of the machine).

Writes benchmarks/results/ray_auth_check-<date>.md: each command and what came back.
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
import shutil
import stat
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).parent))

from _machine import machine
from ray_cost import MARK, free_port, marked, stop

RESULTS = Path(__file__).parent / "results"
DRIVER = """
import os, subprocess, ray
ray.init(address=os.environ["HEAD"], logging_level="ERROR")
@ray.remote
def whoami():
    return os.getuid(), subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip()
print("connected; a task ran as uid %s (%s)" % ray.get(whoami.remote()))
"""


class Transcript:
    def __init__(self, paths: dict[str, str]) -> None:
        self.lines: list[str] = []
        self.paths = paths  # this machine's paths → placeholders, so the result names none

    def note(self, text: str) -> None:
        for path, placeholder in self.paths.items():
            text = text.replace(path, placeholder)
        print(text, flush=True)
        self.lines += [text, ""]

    def run(self, what: str, argv: list[str], env: dict[str, str], shown: str, timeout: float = 90) -> str:
        start = time.monotonic()
        try:
            done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout, check=False)
            out, rc = (done.stdout + done.stderr).strip(), str(done.returncode)
        except subprocess.TimeoutExpired as exc:
            out, rc = _text(exc.stdout) + _text(exc.stderr), f"timed out after {timeout:g} s"
        lines = _interesting(out)
        errors = [ln[:300] for ln in out.splitlines() if re.match(r"^[\w.]*(Error|Exception)\b", ln)]  # what was raised
        tail = "\n".join(errors[-2:] if errors else lines[-4:])
        self.note(f"**{what}**\n\n```\n$ {shown}\nexit: {rc} after {time.monotonic() - start:.0f} s\n{tail}\n```")
        return out


def _text(value: bytes | str | None) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else (value or "")


def _interesting(out: str) -> list[str]:
    """Drop Ray's progress chatter, keep what tells the outcome."""
    skip = ("Local node IP", "--------------------", "Next steps", "To add another node", "To connect to",
            "To submit a Ray", "To monitor", "To terminate", "Alternatively, use", "ray.init()", "ray stop",
            "ray status", "ray start --address", "RAY_API_SERVER", "For more information", "See ")
    return [ln.rstrip()[:220] for ln in out.splitlines() if ln.strip() and not any(s in ln for s in skip)]


def http(url: str, token: str | None) -> str:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=20) as response:
            return f"HTTP {response.status}: {response.read(200).decode(errors='replace')}"
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code}: {exc.read(200).decode(errors='replace')}"
    except OSError as exc:
        return f"error: {exc}"


def listening(mark: str) -> list[str]:
    by_pid = {p.pid: p.name() for p in marked(mark)}
    out = set()
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.pid in by_pid:
            out.add(f"{conn.laddr.ip}:{conn.laddr.port} {by_pid[conn.pid]}")
    return sorted(out)


def check(python: Path, workdir: Path, t: Transcript) -> None:
    ray = str(python.parent / "ray")
    mark = secrets.token_hex(8)
    home, nobody = workdir / "home", workdir / "home-without-token"
    home.mkdir()
    nobody.mkdir()
    base = {"PATH": os.environ["PATH"], MARK: mark, "RAY_TMPDIR": str(workdir / "rt"), "RAY_USAGE_STATS_ENABLED": "0"}
    owner = {**base, "HOME": str(home)}
    t.run("Make a token", [ray, "get-auth-token", "--generate"], owner, "ray get-auth-token --generate")
    token_file = home / ".ray" / "auth_token"
    token = token_file.read_text().strip()
    t.note(f"The token is stored in `~/.ray/auth_token`, mode {stat.filemode(token_file.stat().st_mode)} "
           f"(directory `~/.ray` {stat.filemode(token_file.parent.stat().st_mode)}), {len(token)} characters.")
    port, dash = free_port(), free_port()
    head = f"127.0.0.1:{port}"
    token_env = {**owner, "RAY_AUTH_MODE": "token"}
    ports = ["--num-cpus=1", f"--dashboard-agent-listen-port={free_port()}", f"--metrics-export-port={free_port()}",
             f"--ray-client-server-port={free_port()}"]
    try:
        t.run("Head with token authentication and the dashboard", [ray, "start", "--head", f"--port={port}",
              "--include-dashboard=true", f"--dashboard-port={dash}", *ports], token_env,
              f"RAY_AUTH_MODE=token ray start --head --port={port} --dashboard-port={dash} ...")
        driver = [str(python), "-c", DRIVER]
        t.run("Driver with the token (RAY_AUTH_MODE=token, token from ~/.ray/auth_token)", driver,
              {**token_env, "HEAD": head}, "RAY_AUTH_MODE=token python driver.py")
        t.run("Driver with the token in RAY_AUTH_TOKEN, RAY_AUTH_MODE unset", driver,
              {**base, "HOME": str(nobody), "RAY_AUTH_TOKEN": token, "HEAD": head},
              "RAY_AUTH_TOKEN=<token> python driver.py")
        t.run("Driver without any token, RAY_AUTH_MODE unset", driver, {**base, "HOME": str(nobody), "HEAD": head},
              "python driver.py", timeout=60)
        t.run("Driver with RAY_AUTH_MODE=token but no token", driver,
              {**base, "HOME": str(nobody), "RAY_AUTH_MODE": "token", "HEAD": head},
              "RAY_AUTH_MODE=token python driver.py", timeout=60)
        t.run("Driver with a wrong token", driver,
              {**base, "HOME": str(nobody), "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "0" * 64, "HEAD": head},
              "RAY_AUTH_MODE=token RAY_AUTH_TOKEN=000... python driver.py", timeout=60)
        worker_ports = ["--num-cpus=1", f"--dashboard-agent-listen-port={free_port()}",
                        f"--metrics-export-port={free_port()}"]
        t.run("Worker node joining without a token", [ray, "start", f"--address={head}", *worker_ports],
              {**base, "HOME": str(nobody)}, f"ray start --address={head}", timeout=60)
        t.run("Worker node joining with the token", [ray, "start", f"--address={head}", *worker_ports],
              {**base, "HOME": str(nobody), "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token},
              f"RAY_AUTH_MODE=token RAY_AUTH_TOKEN=<token> ray start --address={head}")
        t.run("`ray status` with the token", [ray, "status", f"--address={head}"], token_env,
              f"RAY_AUTH_MODE=token ray status --address={head}")
        t.run("`ray status` without a token", [ray, "status", f"--address={head}"], {**base, "HOME": str(nobody)},
              f"ray status --address={head}", timeout=60)
        for path in ("/api/version", "/api/jobs/"):
            url = f"http://127.0.0.1:{dash}{path}"
            t.note(f"**Dashboard `GET {path}`** without a token: `{http(url, None)}`; with "
                   f"`Authorization: Bearer <token>`: `{http(url, token)}`")
        t.note("**Listening TCP sockets of the cluster's processes** (address:port process):\n\n```\n"
               + "\n".join(listening(mark)) + "\n```")
    finally:
        stop(mark)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ray-python", type=Path, required=True, help="a Python with ray[default] installed")
    args = parser.parse_args()
    version = subprocess.run([str(args.ray_python), "-c", "import ray; print(ray.__version__)"], capture_output=True,
                             text=True, check=True).stdout.strip()
    m = machine()
    workdir = Path(tempfile.mkdtemp(prefix="ray-auth-"))
    venv = args.ray_python.resolve().parent.parent
    t = Transcript({str(workdir): "$TMP", str(venv): "$VENV", str(Path(__file__).resolve().parents[1]): "$REPO"})
    t.note(f"# Ray token authentication, checked ({m['date']}, ray {version}, {m['host_cpu']}, {m['cores']} cores, "
           f"no GPU, running as uid {os.getuid()})")
    try:
        check(args.ray_python, workdir, t)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"ray_auth_check-{m['date']}.md"
    out.write_text("\n".join(t.lines))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
