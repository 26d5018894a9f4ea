"""A warm estimator: a process that imported torch once and forks one child per estimate.

Why: a cold ``collocate estimate`` of a ResNet-50 spends most of its time importing: ``import
torch`` alone is about 3 s of CPU on a 2-core machine, and ``torch._dynamo`` (pulled in by
``FakeTensorMode`` and by every ``torch.optim`` constructor) 2 s more; tracing and replay take
under a second (benchmarks/results/estimate_speed-2026-11-29b.md). A daemon keeps one such
process on ``estimator.sock`` in its state dir (by default where torch is installed);
``collocate estimate`` asks it first and estimates in its own process (cold) when there is
none, or it refuses, is busy or does not answer. Both run ``api.estimate_memory``: same numbers.

Each request runs in a fresh fork, never in the warm process itself: the user's module is
imported, run and thrown away with the child, so nothing of one estimate reaches the next, and
a crash costs one request. Before it reads anything of the request the child becomes the
requesting user (the socket's peer credentials, admitted by the daemon's own rule,
``server.authorize``): a root daemon's child takes the peer's uid, gid and groups; a user's
daemon answers only its own user. The child then works in the client's directory with the
client's environment (``PYTHONPATH`` on ``sys.path`` as the interpreter would put it), so the
entry point resolves as it would in the client's process.

The warm process runs no kernel (its warm-up traces small models on fake tensors), so no
OpenMP thread pool exists when it forks (a pool does not survive ``fork``), and numpy's
OpenBLAS, which torch loads, is told to start none: the process forks with one thread.

A root warm estimator (a lab daemon's) puts each child in a cgroup of its own before it becomes
the member, as the runner does with a job's attempt (``node/cgroups.py``): a pids limit and
``ESTIMATE_MAX_MEMORY`` of host memory, and whatever the member's code left running is killed
when the child is reaped. Without it a member's estimate would run in the daemon's cgroup,
where a runaway import could take memory from the daemon and from every other member.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import resource
import signal
import socket
import sys
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from collocate.common.errors import CollocateError, InputError

if TYPE_CHECKING:
    from collocate.node.cgroups import AttemptCgroup, Cgroups

#: Estimates answered at once; a further client is told "busy" and estimates cold.
MAX_CHILDREN = 4
#: One estimate's limit in a child, in wall time and (a hard limit the user's code cannot raise)
#: CPU time; the cold path has none, and cpu-run fallbacks can be slow.
ESTIMATE_TIMEOUT_S = 600
#: A request must arrive whole within this of connecting.
REQUEST_TIMEOUT_S = 10.0
MAX_REQUEST_BYTES = 4 * 1024 * 1024  # the client's environment travels with it
#: How often the warm process looks for ended children and a daemon that went away.
POLL_S = 1.0

#: Host memory one estimate may use in its cgroup (root only). A cold ResNet-50 estimate peaks at
#: about 310 MiB and tracing allocates no real tensor; the cpu-run fallback runs small batches on
#: the CPU. Past this the member's estimate is killed (the client then estimates cold, as itself).
ESTIMATE_MAX_MEMORY = 8 * 1024**3

REQUEST_KEYS = ("entry_point", "batch_size", "optimizer", "precision", "gpu", "fallbacks",
                "allocator")


# -- client side --------------------------------------------------------------------------
def ask(socket_path: Path, **request: Any) -> Any:
    """The warm estimator's answer (an ``Estimate``), or ``None`` when it cannot give one (no
    socket, or none this user may reach; refused, busy, crashed): the caller then estimates
    cold. A ``CollocateError`` the estimate raised (a bad entry point) is raised here as cold."""
    from collocate.estimate.base import Estimate

    message = {**{k: request[k] for k in REQUEST_KEYS}, "fallbacks": list(request["fallbacks"]),
               "cwd": os.getcwd(), "env": dict(os.environ)}
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(REQUEST_TIMEOUT_S)
            sock.connect(str(socket_path))
            sock.sendall(json.dumps(message).encode() + b"\n")
            sock.settimeout(ESTIMATE_TIMEOUT_S + REQUEST_TIMEOUT_S)
            reply = json.loads(_read_line(sock, MAX_REQUEST_BYTES) or "null")
    except (OSError, ValueError):
        return None
    if not isinstance(reply, dict):
        return None
    if "estimate" in reply:
        try:
            d = reply["estimate"]
            d["mib"] = math.inf if d["mib"] is None else d["mib"]
            return Estimate(**{f.name: d[f.name] for f in fields(Estimate)})
        except (KeyError, TypeError, ValueError):
            return None
    error = reply.get("error")
    if isinstance(error, dict) and error.get("kind") in ("input", "collocate"):
        cls = InputError if error["kind"] == "input" else CollocateError
        raise cls(error["message"], hint=error.get("hint"))
    return None  # refused, busy or failed: the cold path answers


def _read_line(sock: socket.socket, limit: int) -> str:
    data = bytearray()
    while not data.endswith(b"\n"):
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
        if len(data) > limit:
            raise ValueError("message too long")
    return data.decode()


# -- the warm process ---------------------------------------------------------------------
def warm_up() -> None:
    """Import what an estimate needs and fill torch's lazy caches, estimating small models of
    the two families most jobs are (a ResNet with SGD, a transformer with AdamW) on fake tensors;
    then freeze the heap so that a child's garbage collector leaves the shared pages shared.
    Everything is imported here, as the daemon's user: a child that became a member may not be
    able to read the package's files (a checkout in root's home), and imports nothing after."""
    import gc
    from functools import partial

    import collocate.estimate.analytical  # noqa: F401  the fallbacks, imported only when tracing fails
    import collocate.estimate.baselines  # noqa: F401
    import collocate.estimate.cpurun  # noqa: F401
    from collocate.estimate.api import estimate_memory
    from collocate.workloads.models import build_resnet, build_transformer

    estimate_memory(partial(build_resnet, arch="resnet18", image_size=64, classes=10), batch_size=2)
    estimate_memory(partial(build_transformer, size="tiny", seq=16, vocab=64), batch_size=2)
    gc.freeze()


def listen(socket_path: Path, allow_gid: int | None) -> socket.socket:
    """Bind the socket as the daemon's own (0600, or 0660 for ``--group``). It is bound under
    another name and renamed once it listens: a client that sees the socket is answered."""
    building = socket_path.with_name(socket_path.name + ".new")
    building.unlink(missing_ok=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        sock.bind(str(building))
    finally:
        os.umask(old)
    if allow_gid is not None:
        os.chown(building, -1, allow_gid)
        os.chmod(building, 0o660)
    sock.listen(64)
    sock.settimeout(POLL_S)
    os.replace(building, socket_path)
    return sock


def serve(socket_path: Path, *, allow_gid: int | None = None) -> None:
    """Warm up, then fork a child per connection until the parent (the daemon) goes away."""
    from collocate.node.cgroups import Cgroups

    parent = os.getppid()
    warm_up()
    cgroups = (Cgroups.detect(f"warm-estimator:{socket_path}", max_memory=ESTIMATE_MAX_MEMORY)
               if os.getuid() == 0 else None)
    sock = listen(socket_path, allow_gid)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    children: dict[int, AttemptCgroup | None] = {}
    try:
        for n in itertools.count():
            if os.getppid() != parent:
                break
            _reap(children)
            try:
                conn, _ = sock.accept()
            except TimeoutError:
                continue
            if len(children) >= MAX_CHILDREN:
                _send(conn, {"error": {"kind": "busy", "message": "the warm estimator is busy"}})
                conn.close()
                continue
            cgroup = _confinement(cgroups, n)
            pid = os.fork()
            if pid == 0:
                sock.close()
                _child(conn, allow_gid, cgroup)
            children[pid] = cgroup
            conn.close()
    finally:
        sock.close()
        if socket_path.exists():
            socket_path.unlink()
        for cgroup in children.values():
            _release(cgroup)
        if cgroups is not None:
            cgroups.close()


def _confinement(cgroups: Cgroups | None, n: int) -> AttemptCgroup | None:
    """Request ``n``'s cgroup, made (None where this process cannot confine its children)."""
    cgroup = cgroups.attempt("estimate", n) if cgroups is not None else None
    if cgroup is None:
        return None
    try:
        cgroup.create()
    except OSError:
        return None
    return cgroup


def _release(cgroup: AttemptCgroup | None) -> None:
    """Kill what a member's estimate left running, and remove its cgroup."""
    if cgroup is not None:
        cgroup.kill()
        cgroup.remove()


def _reap(children: dict[int, AttemptCgroup | None]) -> None:
    for pid in list(children):
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            _release(children.pop(pid))


def _send(conn: socket.socket, reply: dict[str, Any]) -> None:
    try:
        conn.sendall(json.dumps(reply).encode() + b"\n")
    except OSError:
        pass  # the client went away: it estimates cold


def _child(conn: socket.socket, allow_gid: int | None, cgroup: AttemptCgroup | None) -> None:
    """Answer one request as its peer, in its own cgroup where there is one, then exit (never
    returns)."""
    code = 0
    try:
        if cgroup is not None:
            cgroup.enter()  # still root: the member cannot leave it
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.alarm(ESTIMATE_TIMEOUT_S)
        resource.setrlimit(resource.RLIMIT_CPU, (ESTIMATE_TIMEOUT_S, ESTIMATE_TIMEOUT_S))  # kept by the user
        conn.settimeout(REQUEST_TIMEOUT_S)
        try:
            become_peer(conn, allow_gid)
            request = json.loads(_read_line(conn, MAX_REQUEST_BYTES))
        except (CollocateError, OSError, ValueError) as exc:
            _send(conn, {"error": {"kind": "refused", "message": str(exc)}})
            return
        conn.settimeout(None)
        _send(conn, answer(request))
    except BaseException:
        import traceback

        traceback.print_exc()  # to the daemon's log; the client estimates cold
        code = 1
    finally:
        conn.close()
        os._exit(code)


def become_peer(conn: socket.socket, allow_gid: int | None) -> None:
    """Take the connecting user's identity, or raise when this process may not serve it."""
    import pwd

    from collocate.wire.peers import authorize, peer_of

    peer = peer_of(conn)
    authorize(peer, daemon_uid=os.getuid(), allow_gid=allow_gid)
    if peer.uid == os.getuid():
        return
    if os.getuid() != 0:
        raise CollocateError(f"a warm estimator of uid {os.getuid()} answers only its own user")
    pw = pwd.getpwuid(peer.uid)
    os.setgroups(os.getgrouplist(pw.pw_name, pw.pw_gid))
    os.setgid(pw.pw_gid)
    os.setuid(pw.pw_uid)


def answer(request: dict[str, Any]) -> dict[str, Any]:
    """Run one estimate in the client's directory and environment; the reply to send."""
    from collocate.estimate.api import estimate_memory

    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    extra = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[0:0] = [os.path.abspath(p) for p in extra]
    try:
        est = estimate_memory(request["entry_point"], batch_size=request["batch_size"],
                              optimizer=request["optimizer"], precision=request["precision"],
                              gpu=request["gpu"], fallbacks=tuple(request["fallbacks"]),
                              allocator=request["allocator"])
    except CollocateError as exc:
        kind = "input" if isinstance(exc, InputError) else "collocate"
        return {"error": {"kind": kind, "message": str(exc.args[0]), "hint": exc.hint}}
    except Exception as exc:  # what the cold path would show as a traceback: it shows it
        return {"error": {"kind": "failed", "message": f"{type(exc).__name__}: {exc}"}}
    return {"estimate": est.to_dict()}


def main(argv: list[str] | None = None) -> None:
    """``python -P -m collocate.estimate.warm SOCKET [GID]`` (started by the daemon)."""
    args = sys.argv[1:] if argv is None else argv
    os.environ["OPENBLAS_NUM_THREADS"] = "1"  # numpy's BLAS (torch imports numpy) starts no thread
    serve(Path(args[0]), allow_gid=int(args[1]) if len(args) > 1 else None)


def command(socket_path: Path, allow_gid: int | None) -> list[str]:
    """The argv that starts a warm estimator: ``-P`` keeps the daemon's directory off
    ``sys.path``, so a request's modules resolve from the client's directory only."""
    gid = [] if allow_gid is None else [str(allow_gid)]
    return [sys.executable, "-P", "-m", "collocate.estimate.warm", str(socket_path), *gid]


if __name__ == "__main__":
    main()
