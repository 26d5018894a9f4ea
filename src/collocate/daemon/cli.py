"""The daemon's own commands: ``serve`` (the daemon in the foreground) and ``demo``. The client
commands (submit, ls, ...) are ``collocate.client.cli``'s."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import typer

from collocate.common.cli_options import StateDirOpt
from collocate.common.errors import InputError
from collocate.daemon.logformat import PrintableLogFormatter


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)
    from collocate.daemon.demo import demo

    app.command("demo")(demo)


def _check_ray_installed() -> None:
    import importlib.util

    if importlib.util.find_spec("ray") is None:
        raise InputError("--ray needs Ray, which is not installed",
                         hint="pip install 'collocate[ray]' (the same Ray version on every node)")


def _torch_installed() -> bool:
    """Whether a warm estimator could start here (found, not imported: serve stays fast)."""
    import importlib.util

    return importlib.util.find_spec("torch") is not None


def serve(
    state_dir: StateDirOpt = None,
    gpus: Annotated[str, typer.Option("--gpus", help="nvml, auto, or emulated:4xA100-40GB.")] = "auto",
    policy: Annotated[str, typer.Option("--policy", help="Placement policy (see `collocate simulate`).")] = "auto",
    param: Annotated[list[str], typer.Option("--param", help="Policy parameter NAME=VALUE (repeatable).")] = [],
    sharing: Annotated[str, typer.Option("--sharing", help="How jobs on one GPU share it: mps "
                       "(NVIDIA MPS, per-job memory limits; one user's jobs per GPU), "
                       "time-slicing, or auto: mps for a daemon of one user where MPS can run, "
                       "else time-slicing (docs/gpus.md).")] = "auto",
    period: Annotated[float, typer.Option("--period", help="Sampling/scheduling period, seconds.")] = 1.0,
    window: Annotated[int, typer.Option("--window", help="Samples in the utilization window.")] = 30,
    group: Annotated[str | None, typer.Option("--group", help="Also serve members of this group.")] = None,
    tcp: Annotated[str | None, typer.Option("--tcp", help="Also listen on HOST:PORT, over TLS "
                   "only (needs --token-file or --user-tokens).")] = None,
    tls: Annotated[str | None, typer.Option("--tls", help="The certificate of --tcp: `self-signed` "
                   "(the default: one made once under the state dir; its SHA-256 fingerprint is "
                   "printed for clients to pin), or give --tls-cert and --tls-key.")] = None,
    tcp_max_per_token: Annotated[int, typer.Option("--tcp-max-per-token", help="TCP connections "
                                 "served at once for the holders of one token (one member), so "
                                 "no one fills the daemon's 64.")] = 8,
    tls_cert: Annotated[Path | None, typer.Option("--tls-cert", help="PEM certificate for --tcp.")] = None,
    tls_key: Annotated[Path | None, typer.Option("--tls-key", help="Its PEM private key.")] = None,
    user_tokens: Annotated[Path | None, typer.Option("--user-tokens", help="File of members' tokens "
                           "for --tcp, one `USER TOKEN` line each: a client with one acts, and its "
                           "jobs run, as that user (docs/security.md).")] = None,
    token_file: Annotated[Path | None, typer.Option("--token-file", help="File (mode 0600) holding "
                          "the owner's access token for --tcp.")] = None,
    dashboard: Annotated[str | None, typer.Option("--dashboard", help="Serve the web dashboard and "
                         "Prometheus /metrics on [HOST:]PORT (127.0.0.1 unless HOST; 0 = any free "
                         "port), behind a token of its own, made once and kept (see "
                         "`collocate dashboard-url`).")] = None,
    no_dashboard_token: Annotated[bool, typer.Option("--no-dashboard-token", help="Serve the "
                                  "dashboard with no token (loopback only; every local user can "
                                  "then read every job's command line and logs).")] = False,
    mlflow: Annotated[bool, typer.Option("--mlflow", help="One MLflow run per job, in a local "
                      "SQLite store under the state dir (needs the mlflow extra: pip install 'collocate\\[mlflow]').")] = False,
    mlflow_uri: Annotated[str | None, typer.Option("--mlflow-uri", help="MLflow tracking URI "
                          "instead of the local store (implies --mlflow).")] = None,
    no_preemption: Annotated[bool, typer.Option("--no-preemption", help="A waiting job of higher "
                             "priority waits for running ones of lower priority instead of "
                             "freezing them (by default it freezes them, their memory kept, and "
                             "they thaw when it ends: docs/policies.md).")] = False,
    take_back_at_once: Annotated[bool, typer.Option("--freeze-at-once", help="When several "
                                 "jobs started on trial slow a neighbour past the limit, freeze as "
                                 "many of the newest as bring it within the limit in one step, "
                                 "instead of one per GPU every 30 s (docs/policies.md).")] = False,
    retry_growth: Annotated[float, typer.Option("--oom-growth", help="OOM: new requirement = peak x this + margin.")] = 1.25,
    ray: Annotated[str | None, typer.Option("--ray", help="Run as the head of the Ray cluster at "
                   "this address (`auto`: the one this machine joined); --gpus is then each "
                   "node's backend. Needs the ray extra (docs/multi-node.md).")] = None,
    node_grace_s: Annotated[float, typer.Option("--node-grace-s", help="With --ray: how long the "
                            "jobs of a node that stopped answering stay unconfirmed before they "
                            "are requeued; their runners stop them after as long without the "
                            "node's agent.")] = 60.0,
    job_max_pids: Annotated[int, typer.Option("--job-max-pids", help="Processes and threads one "
                            "job may have at once, in its cgroup (0: no limit).")] = 4096,
    job_max_memory: Annotated[str | None, typer.Option("--job-max-memory", help="Host memory one "
                              "job may use, e.g. 64GiB (default: accounted, not limited).")] = None,
    log_max: Annotated[str | None, typer.Option("--log-max", help="Bytes kept of each log stream "
                       "of an attempt, e.g. 64MiB; the rest is cut, keeping its last 64 KiB "
                       "(default: 64 MiB, at most 1/32 of the state dir's disk).")] = None,
    disk_reserve: Annotated[str | None, typer.Option("--disk-reserve", help="Free space kept on the "
                            "state dir's disk for the records of accepted jobs: submits are "
                            "refused and logs stop growing below it (default: 5 percent of the disk, "
                            "1 MiB to 1 GiB).")] = None,
    user_max_queued: Annotated[int, typer.Option("--user-max-queued", help="Pending jobs one "
                               "member may have (the owner and root are not limited).")] = 2000,
    user_max_request: Annotated[str, typer.Option("--user-max-request", help="Size of one "
                                "member's submit (command and environment).")] = "1MiB",
    user_max_stored: Annotated[str | None, typer.Option("--user-max-stored", help="What one "
                               "member's jobs may hold in the store and their logs (default: a "
                               "quarter of the state dir's disk).")] = None,
    no_warm_estimator: Annotated[bool, typer.Option(
        "--no-warm-estimator", envvar="COLLOCATE_NO_WARM_ESTIMATOR", show_envvar=False,
        help="Keep no warm estimator. By default, where torch is installed, the daemon keeps a "
             "process with torch imported (about 300 MiB, and some CPU once, started in the "
             "background after the daemon answers) that answers `collocate estimate` for its "
             "users in about 2 s instead of 6. Also COLLOCATE_NO_WARM_ESTIMATOR=1.")] = False,
    warm_estimator: Annotated[bool, typer.Option("--warm-estimator", help="Keep one even where "
                              "torch seems not installed, or COLLOCATE_NO_WARM_ESTIMATOR is set "
                              "(the default where torch is).")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log every job event.")] = False,
) -> None:
    """Run the daemon in the foreground (Ctrl-C stops it; running jobs keep running)."""
    import grp

    from collocate.common.units import option_bytes
    from collocate.core.model import SharingMode
    from collocate.core.policies import make_policy, parse_params
    from collocate.core.recovery import RecoveryRules
    from collocate.daemon.quotas import Quotas
    from collocate.daemon.run import run_daemon
    from collocate.daemon.service import ServeConfig
    from collocate.gpus.mps import default_sharing
    from collocate.wire.paths import resolve_state_dir

    if sharing != "auto" and sharing not in set(SharingMode):
        raise InputError(f"unknown sharing mode {sharing!r}",
                         hint=f"use auto or {' or '.join(SharingMode)} (MIG instances are devices: "
                              "emulated ones with --gpus emulated:4xA100-40GB:mig=3g.20gb+4g.20gb)")
    why_sharing = "chosen with --sharing"
    if sharing == "auto":
        sharing, why_sharing = default_sharing(gpus=gpus, serves_others=group is not None, ray=ray is not None)
    if period <= 0 or window < 1:
        raise InputError("--period must be > 0 and --window >= 1")
    params = parse_params(param)
    make_policy(policy, **params)  # fail before anything starts
    if node_grace_s < 0:
        raise InputError("--node-grace-s must be 0 or more")
    if ray is not None:
        _check_ray_installed()
    gid = None
    if group is not None:
        try:
            gid = grp.getgrnam(group).gr_gid
        except KeyError:
            raise InputError(f"no group {group!r} on this machine") from None
    tcp_addr, token = None, _read_token(token_file)
    members = _read_user_tokens(user_tokens)
    if tls not in (None, "self-signed") or (tls_cert is None) != (tls_key is None):
        raise InputError("--tls takes `self-signed`; or give both --tls-cert and --tls-key")
    if not 1 <= tcp_max_per_token <= 64:
        raise InputError("--tcp-max-per-token must be 1 to 64 (the daemon serves 64 TCP connections)")
    if tcp is not None:
        host, _, port = tcp.rpartition(":")
        if not host or not port.isdigit():
            raise InputError(f"cannot read --tcp {tcp!r}", hint="write HOST:PORT, e.g. 127.0.0.1:7070")
        if token is None and not members:
            raise InputError("--tcp needs --token-file", hint="put a long random token in a file only you can read")
        tcp_addr = (host, int(port))
    tracking = _tracking_config(dashboard, None, mlflow, mlflow_uri, dashboard_auth=not no_dashboard_token)
    if job_max_pids < 0 or user_max_queued < 1:
        raise InputError("--job-max-pids must be 0 or more and --user-max-queued 1 or more")
    quotas = Quotas(max_queued=user_max_queued, max_request=option_bytes(user_max_request, "--user-max-request") or Quotas().max_request,
                    max_stored=option_bytes(user_max_stored, "--user-max-stored"),
                    log_max=option_bytes(log_max, "--log-max"), disk_reserve=option_bytes(disk_reserve, "--disk-reserve"))
    stream = logging.StreamHandler()  # the file log in the state dir always gets INFO
    stream.setLevel(logging.INFO if verbose else logging.WARNING)
    stream.setFormatter(PrintableLogFormatter())
    logging.getLogger().addHandler(stream)
    config = ServeConfig(
        state_dir=resolve_state_dir(state_dir), gpus=gpus, policy=policy, policy_params=params,
        sharing=SharingMode(sharing), period_s=period, window=window, allow_gid=gid, tcp=tcp_addr,
        token=token if tcp_addr is not None else None, rules=RecoveryRules(growth=retry_growth),
        tracking=tracking, ray=ray, node_grace_s=node_grace_s, quotas=quotas,
        job_max_pids=job_max_pids or None, job_max_memory=option_bytes(job_max_memory, "--job-max-memory"),
        tls_cert=tls_cert, tls_key=tls_key, tls_self_signed=tls_cert is None, user_tokens=members,
        tcp_max_per_token=tcp_max_per_token, preemption=not no_preemption,
        take_back_at_once=take_back_at_once,
        warm_estimator=warm_estimator or (not no_warm_estimator and _torch_installed()),
    )

    def ready(service) -> None:
        typer.echo(f"collocate daemon: {len(service.watch.devices)} GPU(s) ({service.backend.name}), "
                   f"policy {policy}{_rule_notes(service.scheduler.suspend_rules)}, sharing {sharing} ({why_sharing}), "
                   f"state {service.layout.root}", err=True)
        typer.echo(f"  {service.fleet.confinement_words()}", err=True)
        if service.server.tcp_port is not None:
            secure = f"TLS, certificate SHA-256 fingerprint {service.tls_fingerprint}"
            typer.echo(f"  TCP API on {config.tcp[0] if config.tcp else ''}:{service.server.tcp_port} "
                       f"({secure})", err=True)
        typer.echo(f"  {service.quotas.describe()}", err=True)
        if config.warm_estimator:
            typer.echo("  a warm estimator for `collocate estimate` is starting in the background "
                       "(torch imported once, about 300 MiB; --no-warm-estimator spares them)", err=True)
        server, secret = service.tracking.dashboard_server, service.tracking.dashboard_token
        if server is not None:  # a generated token is printed once, like Jupyter's
            shown = "" if secret is None else "?token=" + secret
            typer.echo(f"dashboard on {server.url}{shown} (Prometheus: {server.url}metrics; "
                       "`collocate dashboard-url` prints the URL again)", err=True)

    run_daemon(config, on_ready=ready)


def _rule_notes(rules) -> str:
    """`` (no preemption, pile-ups taken back at once)`` for the start line: the suspension rules
    the scheduler runs with where they differ from the defaults."""
    notes = [note for note, on in (("no preemption", rules is not None and not rules.preempt),
                                   ("pile-ups taken back at once", rules is not None and rules.at_once)) if on]
    return f" ({', '.join(notes)})" if notes else ""


def _read_token(token_file: Path | None) -> str | None:
    from collocate.common.tls import read_secret

    if token_file is None:
        return None
    try:
        token = read_secret(token_file, "--token-file").strip()
    except OSError as exc:
        raise InputError(f"cannot read --token-file {token_file}: {exc}",
                         hint="give a file you can read holding one long random token") from exc
    if len(token) < 16:
        raise InputError("the token is too short", hint="use at least 16 random characters, "
                         "e.g. `openssl rand -hex 16 > token`")
    return token


def _read_user_tokens(path: Path | None) -> dict[str, str]:
    """``--user-tokens``: ``USER TOKEN`` per line (``#`` comments), token → user."""
    if path is None:
        return {}
    from collocate.common.tls import read_secret

    try:
        lines = read_secret(path, "--user-tokens").splitlines()
    except OSError as exc:
        raise InputError(f"cannot read --user-tokens {path}: {exc}") from exc
    tokens: dict[str, str] = {}
    for number, line in enumerate(lines, 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        if len(words) != 2 or len(words[1]) < 16 or words[1] in tokens:
            raise InputError(f"{path}:{number}: expected `USER TOKEN` with a token of 16 or more "
                             "characters used once", hint="e.g. `alice 3f9c...` (openssl rand -hex 32)")
        tokens[words[1]] = words[0]
    return tokens


def _tracking_config(dashboard: str | None, token: str | None, mlflow: bool,
                     mlflow_uri: str | None, *, dashboard_auth: bool = True):
    """Validate the monitoring options before anything starts (a clear error, not a half-up daemon)."""
    from collocate.daemon.tracking import (
        TrackingConfig,
        check_dashboard,
        check_mlflow,
        parse_dashboard,
    )

    addr = None
    if dashboard is not None:
        addr = parse_dashboard(dashboard)
        check_dashboard(addr, dashboard_auth)
    uri = None
    if mlflow or mlflow_uri is not None:
        check_mlflow()
        uri = mlflow_uri or ""
    return TrackingConfig(dashboard=addr, dashboard_token=token if addr is not None else None,
                          dashboard_auth=dashboard_auth, mlflow_uri=uri)


