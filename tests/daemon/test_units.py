"""Pure parts of the daemon: submit validation, launch plans, the store, the monitor's snapshot."""

from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import fields, replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from collocate.common.errors import InputError
from collocate.core.belief import Belief
from collocate.core.knowledge import ProfileKnowledge
from collocate.core.model import GpuId, Job, JobProfile, JobState, Placement, SharingMode
from collocate.daemon.gpu_watch import GpuWatch
from collocate.daemon.plan import plan_launch
from collocate.daemon.store import Attempt, Store, job_from_json, job_to_json
from collocate.daemon.views import gpu_rows
from collocate.gpus.base import DeviceInfo, DeviceSample, ProcessUsage
from collocate.gpus.mps import MpsDirs
from collocate.node.isolate import bootstrap_argv
from collocate.wire.paths import ENV_STATE_DIR, resolve_state_dir
from collocate.wire.spec import JobSpec, default_name, parse_env, validate_submit


def _req(**kw):
    base = {"argv": ["python", "train.py"], "cwd": "/"}
    return validate_submit({**base, **kw}, uid=1000, gid=1000, user="ada")


def test_a_cpu_job_is_a_valid_submit():
    r = _req(gpus=0)
    assert r.gpus == 0 and r.mem_mib is None


def test_validate_submit_fields():
    r = _req(mem="6GiB", gpus=2, retries=5, env=["A=1", "B=x=y"], base_env={"PATH": "/bin",
             "CUDA_VISIBLE_DEVICES": "3"}, priority="4")
    assert r.mem_mib == 6144 and r.gpus == 2 and r.max_retries == 5 and r.priority == 4
    assert r.spec.env == {"PATH": "/bin", "A": "1", "B": "x=y"}  # the client's CVD never leaks in
    assert r.spec.retry_failures and r.spec.uid == 1000
    assert _req().max_retries == 3 and not _req().spec.retry_failures


@pytest.mark.parametrize("bad", [
    {"argv": []}, {"argv": [""]}, {"argv": "python"}, {"cwd": "rel"}, {"cwd": "/no/such/dir"},
    {"mem": "6 lots"}, {"mem": "0"}, {"gpus": -1}, {"gpus": 0, "mem": "1GiB"}, {"gpus": 0, "nodes": 2},
    {"gpus": 0, "dataset": "d"}, {"gpus": True}, {"retries": -1}, {"retries": 1000},
    {"env": ["=1"]}, {"env": ["1A=1"]}, {"env": ["COLLOCATE_JOB_ID=3"]}, {"priority": "high"},
])
def test_validate_submit_rejects(bad):
    with pytest.raises(InputError):
        _req(**bad)


def test_static_estimate_fields_are_checked():
    r = _req(mem="700", mem_source="static-traced", mem_uncertainty=0.28)
    assert (r.mem_mib, r.mem_source, r.mem_uncertainty) == (700, "static-traced", 0.28)
    with pytest.raises(InputError, match="memory source"):
        _req(mem="700", mem_source="history")  # only the daemon measures history
    with pytest.raises(InputError, match="uncertainty"):
        _req(mem="700", mem_source="static-traced", mem_uncertainty=-1)


def test_parse_env():
    assert parse_env(["A=", "B_2=3"]) == {"A": "", "B_2": "3"}
    with pytest.raises(InputError, match="NAME=VALUE"):
        parse_env(["NOPE"])


def test_identity_is_the_command_and_cwd_not_the_environment():
    a = JobSpec(("python", "t.py", "--lr", "1"), "/w", {"X": "1"})
    assert a.keys.identity == JobSpec(("python", "t.py", "--lr", "1"), "/w", {"X": "2"}).keys.identity
    assert a.keys.identity != JobSpec(("python", "t.py", "--lr", "2"), "/w").keys.identity
    assert a.keys.identity != JobSpec(("python", "t.py", "--lr", "1"), "/v").keys.identity


def test_launch_plan_is_exact(tmp_path):
    job = Job("7", gpus=2, mem_mib=6000, profile=JobProfile(0.3, 0.1))
    spec = JobSpec(("python", "train.py"), "/work", {"HOME": "/home/ada"}, uid=1000, gid=100)
    placement = Placement("7", (GpuId("n", 0), GpuId("n", 1)), 6000.0)
    plan = plan_launch(job, spec, placement, ("GPU-a", "GPU-b"), attempt=2, attempt_dir=tmp_path,
                       sharing=SharingMode.TIME_SLICING, emulated_dir=None, daemon_uid=0)
    assert plan.argv == (*bootstrap_argv("collocate.node.runner"), "--dir", str(tmp_path),
                         "--uid", "1000", "--gid", "100", "--cwd", "/work",
                         "--env-file", str(tmp_path / "env.json"),
                         "--command-file", str(tmp_path / "command.json"))
    # the command travels in a 0600 file, never on a root process's command line (/proc)
    assert plan.command == ("python", "train.py") and "train.py" not in plan.argv
    # the runner starts isolated: python -I, from the daemon's own installation
    assert plan.argv[:3] == (sys.executable, "-I", "-c")
    assert plan.env == {"HOME": "/home/ada", "CUDA_VISIBLE_DEVICES": "GPU-a,GPU-b", "COLLOCATE_JOB_ID": "7",
                        "COLLOCATE_ATTEMPT": "2", "COLLOCATE_SHARING": "time-slicing",
                        "COLLOCATE_MEM_FENCE_MIB": "7412"}  # 6000 × 1.15 + 512: fenced under time-slicing too
    for unfenced in (replace(job, mem_fence=False), replace(job, fence_lifted=True), replace(job, alone=True)):
        assert "COLLOCATE_MEM_FENCE_MIB" not in plan_launch(
            unfenced, spec, placement, ("GPU-a", "GPU-b"), attempt=2, attempt_dir=tmp_path,
            sharing=SharingMode.TIME_SLICING, emulated_dir=None, daemon_uid=0).env
    assert (plan.uid, plan.gid, plan.cwd) == (1000, 100, "/work")  # root daemon: runs as the submitter
    same_user = plan_launch(job, spec, placement, ("GPU-a", "GPU-b"), attempt=2, attempt_dir=tmp_path,
                            sharing=SharingMode.TIME_SLICING, emulated_dir=None, daemon_uid=1000)
    assert same_user.uid is None and "--uid" not in same_user.argv
    # log_metric() appends to the attempt's metrics file; a job run as another user by a root
    # daemon gets none (it could not write the state dir), so its log_metric is a no-op.
    assert same_user.env["COLLOCATE_METRICS_FILE"] == str(tmp_path / "metrics.jsonl")
    assert "COLLOCATE_METRICS_FILE" not in plan.env


def test_a_cpu_jobs_launch_plan_shows_cuda_no_device_and_no_mps(tmp_path):
    job = Job("8", gpus=0)
    plan = plan_launch(job, JobSpec(("x",), "/"), Placement("8", ()), (), attempt=1, attempt_dir=tmp_path,
                       sharing=SharingMode.MPS, emulated_dir=None, mps_dirs=MpsDirs.under(tmp_path))
    assert plan.env["CUDA_VISIBLE_DEVICES"] == ""
    assert not [k for k in plan.env if k.startswith("CUDA_MPS")]


def test_a_cpu_attempt_keeps_its_node_across_the_store(tmp_path):
    store = Store(tmp_path / "s.db")
    a = Attempt("9", 1, 5.0, (), (), str(tmp_path), host="n2")
    store.add_attempt(a)
    assert store.attempts("9")[0].host == "n2" and store.attempts("9")[0].nodes == ("n2",)
    assert Attempt("9", 1, 5.0, ("n0:1",), ("GPU-a",), "d").nodes == ("n0",)


def test_launch_plan_mps_limits_from_the_estimate(tmp_path):
    job = Job("7", mem_mib=6000, profile=JobProfile(0.35, 0.1))
    placement = Placement("7", (GpuId("n", 0),), 6000.0)
    plan = plan_launch(job, JobSpec(("x",), "/"), placement, ("GPU-a",), attempt=1, attempt_dir=tmp_path,
                       sharing=SharingMode.MPS, emulated_dir=Path("/emu"), mps_dirs=MpsDirs.under(tmp_path))
    # no thread cap from the job's solo SM activity (it slowed jobs running alone on an H100)
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in plan.env
    # a declared 6,000 MiB may run 15% above it (estimates came out at 0.88x), plus 512 MiB
    assert plan.env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=7412M"
    measured = plan_launch(job.evolve(mem_source="history", mem_uncertainty=0.05), JobSpec(("x",), "/"),
                           placement, ("GPU-a",), attempt=1, attempt_dir=tmp_path,
                           sharing=SharingMode.MPS, emulated_dir=None, mps_dirs=MpsDirs.under(tmp_path))
    assert measured.env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=6812M"  # its own 5% + 512 MiB
    unknown = plan_launch(Job("8"), JobSpec(("x",), "/"), Placement("8", (GpuId("n", 0),), 30000.0),
                          ("GPU-a",), attempt=1, attempt_dir=tmp_path, sharing=SharingMode.MPS,
                          emulated_dir=None, mps_dirs=MpsDirs.under(tmp_path))
    assert unknown.env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=30000M"  # the room it was given
    assert plan.env["COLLOCATE_EMULATED_DIR"] == "/emu" and plan.env["COLLOCATE_SHARING"] == "mps"
    assert plan.env["CUDA_MPS_PIPE_DIRECTORY"].startswith(str(tmp_path))


def _belief(sm: float, dram: float, source: str = "inferred") -> Belief:
    return Belief(JobProfile(sm, dram), 0.03 ** 2, 0.02 ** 2, source)


def test_store_round_trip(tmp_path):
    store = Store(tmp_path / "db.sqlite")
    job = Job("1", gpus=1, mem_mib=None, profile=JobProfile(0.2, 0.1), profile_var=(0.01, 0.004),
              state=JobState.PENDING, user="ada")
    assert job_from_json(job_to_json(job)) == job
    assert store.next_id() == "1" and store.next_id() == "2"
    store.add_job(job, JobSpec(("a",), "/"))
    store.save_job(Job("1", state=JobState.DONE))
    (loaded, spec, ended), = store.jobs()
    assert loaded.state is JobState.DONE and ended is not None and spec.argv == ("a",)
    store.add_attempt(Attempt("1", 1, 10.0, ("n:0",), ("GPU-a",), str(tmp_path)))
    assert [a.n for a in store.open_attempts()] == [1]
    store.record_history("id", 3000.0, _belief(0.4, 0.3))
    store.record_history("id", 3100.0, None)  # a run that taught nothing keeps the old belief
    assert store.history_peak("id") == 3100.0
    kept = store.identity_belief("id")
    assert kept.profile == JobProfile(0.4, 0.3) and kept.source == "history"
    assert kept.sm_sd == pytest.approx(0.05)  # history is never surer than HISTORY_SD_FLOOR
    store.record_history("id", None, _belief(0.6, 0.1))  # taught, but no peak measured
    assert store.history_peak("id") == 3100.0 and store.identity_belief("id").profile == JobProfile(0.6, 0.1)
    store.close()


def test_store_opens_a_file_from_before_identities(tmp_path):
    """An older file gains the new columns and table; its command-keyed history is not read."""
    import sqlite3

    path = tmp_path / "db.sqlite"
    old = sqlite3.connect(path)
    old.executescript(
        "CREATE TABLE attempts (job_id TEXT NOT NULL, n INTEGER NOT NULL, start REAL NOT NULL,"
        " end REAL, gpus TEXT NOT NULL, uuids TEXT NOT NULL, mem_mib REAL, dir TEXT NOT NULL,"
        " pid INTEGER, pid_started REAL, returncode INTEGER, outcome TEXT, reason TEXT,"
        " peak_mib REAL, sm_activity REAL, PRIMARY KEY (job_id, n));"
        "CREATE TABLE history (signature TEXT PRIMARY KEY, peak_mib REAL NOT NULL,"
        " sm_activity REAL, runs INTEGER NOT NULL, updated REAL NOT NULL);"
        "INSERT INTO history VALUES ('sig', 2500.0, 0.07, 3, 0.0);"
        "INSERT INTO attempts (job_id, n, start, gpus, uuids, dir, sm_activity)"
        " VALUES ('1', 1, 5.0, '[\"n:0\"]', '[\"GPU-a\"]', '/', 0.07);")
    old.commit()
    old.close()
    store = Store(path)
    assert store.history_peak("sig") is None
    (attempt,) = store.open_attempts()
    assert attempt.solo_sm is None and attempt.gpus == ("n:0",)
    store.record_history("id", 2600.0, _belief(0.5, 0.25), family="fam")
    assert ProfileKnowledge(store).known("new", "fam").source == "similar"
    store.close()
    assert Store(path).history_peak("id") == 2600.0  # reopening adds nothing


def test_a_family_prior_comes_from_the_measured_identities_of_the_family(tmp_path):
    store = Store(tmp_path / "db.sqlite")
    assert ProfileKnowledge(store).known("new", "p").source == "assumed"
    store.record_history("a", 1000.0, _belief(0.2, 0.1), family="p")
    store.record_history("b", 1000.0, None, family="p")  # taught nothing: no vote
    store.record_history("c", 1000.0, _belief(0.6, 0.3), family="p")
    store.record_history("d", 1000.0, _belief(0.5, 0.2), family="p")
    store.record_history("e", 1000.0, _belief(0.9, 0.9), family="q")  # another family
    similar = ProfileKnowledge(store).known("new", "p")
    assert similar.source == "similar" and similar.profile.sm_activity == pytest.approx(0.5)
    assert ProfileKnowledge(store).known("c", "p").profile == JobProfile(0.6, 0.3)
    store.close()


def test_identity_and_family_of_a_spec_follow_the_one_rule():
    sweep = [JobSpec(("python", "train.py", "--lr", lr, "--out", f"runs/{lr}"), "/w") for lr in ("0.1", "0.2")]
    assert sweep[0].keys.family == sweep[1].keys.family and sweep[0].keys.identity != sweep[1].keys.identity
    again = JobSpec(("python", "train.py", "--lr", "0.1", "--out", "runs/again"), "/w")
    assert again.keys.identity == sweep[0].keys.identity  # a new output path: the same job
    assert JobSpec(("python", "eval.py", "--lr", "0.1"), "/w").keys.family != sweep[0].keys.family
    assert JobSpec(("python", "train.py", "--lr", "0.1"), "/v").keys.family != sweep[0].keys.family
    modules = [JobSpec(("python", "-m", m, "--x", "1"), "/w").keys.family for m in ("pkg.a", "pkg.b")]
    assert modules[0] != modules[1]


def test_a_job_stored_before_profile_sources_keeps_its_measured_profile():
    import json

    job = Job("1", profile=JobProfile(0.4, 0.1), profile_source="history")
    text = json.loads(job_to_json(job))
    del text["profile_source"]
    assert job_from_json(json.dumps(text)).profile_source == "history"
    plain = json.loads(job_to_json(Job("2")))
    del plain["profile_source"]
    assert job_from_json(json.dumps(plain)).profile_source == "assumed"


class _Backend:
    name = "fake"

    def __init__(self, samples):
        self.samples = samples

    def devices(self):
        return [DeviceInfo(GpuId("n", i), f"GPU-{i}", "A100-40GB", 40000.0, 108) for i in range(2)]

    def sample(self):
        return self.samples

    def close(self):
        pass


def _watch(samples, **kw) -> GpuWatch:
    return GpuWatch(_Backend(samples), sharing=SharingMode.TIME_SLICING, params=None, window=5, **kw)


class _Joining(_Backend):
    """Node n's two GPUs; node m's one GPU once it has joined, with job 1's process (pid 30)."""

    def __init__(self):
        super().__init__([])
        self.joined = False

    def devices(self):
        joined = [DeviceInfo(GpuId("m", 0), "GPU-m0", "A100-40GB", 40000.0, 108)] if self.joined else []
        return super().devices() + joined

    def sample(self):
        return [DeviceSample(d.uuid, 0.0, 3000.0 if d.id.node == "m" else 0.0, 37000.0 if d.id.node == "m" else 40000.0,
                             sm_activity=0.4 if d.id.node == "m" else 0.0,
                             processes=(ProcessUsage(30, 3000.0, 0.4),) if d.id.node == "m" else ())
                for d in self.devices()]


@pytest.mark.parametrize("sharing", [SharingMode.TIME_SLICING, SharingMode.MPS])
def test_a_gpu_that_joins_after_start_shows_in_every_view_with_its_job(sharing):
    # once, a per-device array the world forgot to grow broke ``collocate gpus`` after a node joined
    backend = _Joining()
    watch = GpuWatch(backend, sharing=sharing, params=None, window=5)
    watch.read()
    watch.observe({}, now=1.0)
    backend.joined = True
    watch.read()  # takes in the GPU of the node that joined
    watch.place(Job("1", mem_mib=4000, mem_source="declared", user="ann"), ("GPU-m0",), 2.0)
    watch.read()
    watch.observe({"1": frozenset({30})}, now=3.0)
    snap = watch.snapshot(3.0)
    assert [str(g) for g in snap.ids] == ["n:0", "n:1", "m:0"]
    per_device = {f.name: getattr(snap, f.name) for f in fields(snap)
                  if isinstance(getattr(snap, f.name), np.ndarray) or f.name in ("owner", "residents")}
    assert not [name for name, v in per_device.items() if len(v) not in (0, 3)], "a per-device view not grown"
    assert snap.n_jobs.tolist() == [0, 0, 1] and snap.committed_mib.tolist() == [0.0, 0.0, 4000.0]
    assert snap.launch_seen_at[2] == 3.0 and snap.util_sm[2] > 0.0 and list(snap.residents[2]) == ["1"]
    assert list(snap.owner) == (["", "", "ann"] if sharing is SharingMode.MPS else [])
    run = SimpleNamespace(attempt=SimpleNamespace(uuids=("GPU-m0",)), pids=frozenset({30}))
    rows = gpu_rows(watch, {"1": run}, 3.0)  # what ``collocate gpus`` shows
    assert [r["id"] for r in rows] == ["n:0", "n:1", "m:0"]
    joined = rows[2]
    assert joined["jobs"] == ["1"] and joined["job_mib"] == {"1": 3000.0} and joined["committed_mib"] == 4000.0
    assert joined["sm_window"] > 0.0 and joined["slowed"] is None and joined["frozen"] == 0


def test_the_watch_attributes_memory_to_jobs_and_charges_what_nobody_owns():
    samples = [DeviceSample("GPU-0", 0.0, 5000, 35000, sm_activity=0.5, processes=(ProcessUsage(11, 5000, 0.5),)),
               DeviceSample("GPU-1", 0.0, 2500, 37500, sm_activity=0.0, processes=(ProcessUsage(99, 2500, 0.0),))]
    watch = _watch(samples)
    watch.place(Job("1", mem_mib=6000, mem_source="declared"), ("GPU-0",), 99.0)
    watch.place(Job("2", mem_mib=None), ("GPU-1",), 99.0)
    watch.read()
    watch.observe({"1": frozenset({10, 11}), "2": frozenset({20})}, now=100.0)
    seen, unseen = watch.resident("1"), watch.resident("2")
    assert seen.seen_at == 100.0 and seen.ramp.peak_mib == 5000 and unseen.seen_at == math.inf
    snap = watch.snapshot(101.0)
    assert snap.launch_seen_at.tolist() == [100.0, math.inf]
    # unknown memory commits the whole GPU but what others hold; pid 99 is nobody's
    assert snap.committed_mib.tolist() == [6000.0, 40000.0 - 2500.0]
    assert snap.other_mib.tolist() == [0.0, 2500.0] and watch.other_mib["GPU-1"] == 2500.0
    assert snap.free_mib.tolist() == [35000.0, 37500.0]
    # the known job outgrows its 6,000 MiB: it commits what it holds and a margin
    watch.backend.samples = [DeviceSample("GPU-0", 0.0, 9000, 31000, sm_activity=0.5,
                                          processes=(ProcessUsage(11, 9000, 0.5),)), samples[1]]
    watch.read()
    watch.observe({"1": frozenset({11}), "2": frozenset({20})}, now=102.0)
    assert watch.snapshot(103.0).committed_mib[0] == pytest.approx(9000 * 1.1 + 512)


def test_an_unreachable_device_takes_nothing():
    samples = [DeviceSample("GPU-0", 0.0, 0, 40000, reachable=False), DeviceSample("GPU-1", 0.0, 0, 40000)]
    watch = _watch(samples)
    watch.read()
    watch.observe({}, now=1.0)
    snap = watch.snapshot(1.0)  # its node is away: the GPU is left out until it answers
    assert [str(g) for g in snap.ids] == ["n:1"] and snap.other_mib.tolist() == [0.0]


def test_state_dir_resolution(monkeypatch, tmp_path):
    monkeypatch.setenv(ENV_STATE_DIR, str(tmp_path / "env"))
    assert resolve_state_dir(tmp_path / "flag") == tmp_path / "flag"
    assert resolve_state_dir() == tmp_path / "env"
    monkeypatch.delenv(ENV_STATE_DIR)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert resolve_state_dir() == tmp_path / "xdg" / "collocate"
    monkeypatch.delenv("XDG_STATE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert resolve_state_dir() == tmp_path / ".local" / "state" / "collocate"
    assert os.path.isabs(resolve_state_dir())


def test_authorize_owner_root_and_group_only(monkeypatch):
    import grp as grp_module

    from collocate.daemon.server import Peer, Refused, authorize

    authorize(Peer(uid=1000, gid=1000), daemon_uid=1000, allow_gid=None)
    authorize(Peer(uid=0, gid=0), daemon_uid=1000, allow_gid=None)
    with pytest.raises(Refused, match="may not use"):
        authorize(Peer(uid=1001, gid=1001), daemon_uid=1000, allow_gid=None)
    authorize(Peer(uid=1001, gid=500), daemon_uid=1000, allow_gid=500)  # primary group
    monkeypatch.setattr(grp_module, "getgrgid", lambda gid: type("G", (), {"gr_mem": ["bob"]})())
    monkeypatch.setattr(Peer, "user", property(lambda self: "bob" if self.uid == 1002 else "eve"))
    authorize(Peer(uid=1002, gid=1002), daemon_uid=1000, allow_gid=500)  # supplementary member
    with pytest.raises(Refused):
        authorize(Peer(uid=1003, gid=1003), daemon_uid=1000, allow_gid=500)


def test_protocol_rejects_garbage():
    import io

    from collocate.wire import protocol

    with pytest.raises(protocol.ProtocolError):
        protocol.read_message(io.BytesIO(b"not json\n"))
    with pytest.raises(protocol.ProtocolError):
        protocol.read_message(io.BytesIO(b"[1, 2]\n"))
    with pytest.raises(protocol.ProtocolError):
        protocol.read_message(io.BytesIO(b'{"op": "ls"}'))  # truncated: no newline
    assert protocol.read_message(io.BytesIO(b"")) is None
    with pytest.raises(InputError, match="valid requests"):
        protocol.check_request({"op": "rm -rf"})


def test_dataset_fields_are_checked_and_kept_in_the_spec():
    base = {"argv": ["python", "t.py"], "cwd": "/"}
    req = validate_submit({**base, "dataset": "cifar", "dataset_factory": "pkg.data:make"}, uid=1, gid=1, user="u")
    assert (req.spec.dataset, req.spec.dataset_factory) == ("cifar", "pkg.data:make")
    assert JobSpec.from_json(req.spec.to_json()) == req.spec
    assert JobSpec.from_json('{"argv": ["a"], "cwd": "/"}').dataset is None  # rows from before
    for bad, message in (({"dataset": "bad name/"}, "invalid shared dataset name"),
                         ({"dataset": "ok", "dataset_factory": "nocolon"}, "not module:factory"),
                         ({"dataset_factory": "a:b"}, "needs --dataset"),
                         ({"env": ["COLLOCATE_SHARE_DIR=/x"]}, "set by the daemon")):
        with pytest.raises(InputError, match=message):
            validate_submit({**base, **bad}, uid=1, gid=1, user="u")


def test_dataset_factory_is_remembered_and_conflicts_refused():
    from collocate.daemon.producers import resolve_factory

    def spec(factory=None, dataset="d"):
        return JobSpec(("a",), "/", dataset=dataset, dataset_factory=factory)

    specs = {"1": spec("m:old"), "2": spec("m:new")}
    done = [Job("1", state=JobState.DONE), Job("2", state=JobState.FAILED)]
    assert resolve_factory(spec(), done, specs) == "m:new"  # the most recent job's
    assert resolve_factory(spec("m:other"), done, specs) == "m:other"  # nothing active: free
    running = [Job("1", state=JobState.RUNNING), Job("2", state=JobState.DONE)]
    assert resolve_factory(spec(), running, specs) == "m:old"  # the active job's wins
    with pytest.raises(InputError, match="already served by m:old"):
        resolve_factory(spec("m:new"), running, specs)
    with pytest.raises(InputError, match="needs a factory"):
        resolve_factory(spec(dataset="fresh"), running, specs)


def test_monitor_tells_the_policy_which_gpus_read_which_dataset():
    watch = _watch([])
    watch.place(Job("1", mem_mib=1000, dataset="cifar"), ("GPU-1",), 0.0)
    watch.place(Job("2", mem_mib=1000), ("GPU-0",), 0.0)
    assert dict(watch.snapshot(1.0).datasets) == {"cifar": (1,)}


@pytest.mark.parametrize(
    ("argv", "name"),
    [
        (["python", "train.py", "--lr", "3"], "train.py"),
        (["/usr/bin/python3.11", "-u", "src/train.py"], "train.py"),
        (["python", "-m", "mypkg.train", "--epochs", "3"], "mypkg.train"),
        (["torchrun", "--nproc_per_node", "2", "train.py"], "train.py"),
        (["uv", "run", "finetune"], "finetune"),
        (["bash", "-c", "echo hi"], "echo"),  # names are seen by all: no inline code
        (["python3", "-c", "print('key')"], "python3 -c"),
        (["./train.sh", "x"], "train.sh"),
        (["python"], "python"),
        # NAME=VALUE words carry secrets inline: never a name (issue 36)
        (["bash", "-c", "TOKEN=hunter2 sleep 300"], "sleep"),
        (["sh", "-c", "A=1 B=2 env C=3 python t.py"], "python"),
        (["sh", "-c", "export KEY=s"], "sh"),
        (["sh", "-c", "X=1"], "sh"),
        (["env", "PASSWORD=s", "train"], "train"),
    ],
)
def test_default_job_names_show_what_a_launcher_runs(argv, name):
    assert default_name(argv) == name


def test_policies_see_a_mig_instance_at_its_share_of_the_gpu(tmp_path):
    from collocate.gpus.emulated import EmulatedBackend

    backend = EmulatedBackend.create(tmp_path, "2xA100-40GB:mig1=3g.20gb,4g.20gb", node="n0")
    snap = GpuWatch(backend, sharing=SharingMode.TIME_SLICING, params=None, window=5).snapshot(1.0)
    assert [round(s, 3) for s in snap.speed] == [1.0, round(42 / 98, 3), round(56 / 98, 3)]


def test_a_mig_instance_reads_alike_from_the_daemons_watch_and_the_simulators_meters(tmp_path):
    """A monitor reads a MIG instance relative to its own SMs; the simulator's meters give the
    same activity in whole-GPU units. The watch hands the world whole-GPU units too, so a job
    doing a fifth of a whole GPU's work reads the same level on a 3g instance in both worlds
    (relative to the instance: 0.2 / (42/98)), not that level divided by the instance's share
    again."""
    import os

    from collocate.core.world import Device, World
    from collocate.gpus.emulated import EmulatedBackend
    from collocate.gpus.emulated_state import process_start_time

    backend = EmulatedBackend.create(tmp_path, "1xA100-40GB:mig0=3g.20gb,4g.20gb", node="n0")
    watch = GpuWatch(backend, sharing=SharingMode.TIME_SLICING, params=None, window=5)
    uuid = watch.devices[0].uuid
    assert backend.store.claim(uuid, os.getpid(), process_start_time(os.getpid()), 1000, 0.2, 0.1) is None
    watch.read()
    watch.observe({}, now=1.0)
    fed = World([Device(d.id, d.total_mib, d.sm_fraction) for d in watch.devices],
                sharing=SharingMode.TIME_SLICING, params=None, window=None)
    fed.set_reading(0, 1.0, 0.2, 0.1, other_mib=1000.0)  # the simulator's meters: whole-GPU units
    daemon, simulator = watch.snapshot(1.0), fed.snapshot(1.0)
    assert daemon.sm_recent[0] == pytest.approx(simulator.sm_recent[0]) == pytest.approx(0.2 / (42 / 98))
    assert daemon.util_sm[0] == pytest.approx(simulator.util_sm[0])
    assert daemon.util_dram[0] == pytest.approx(simulator.util_dram[0]) == pytest.approx(0.1 / (42 / 98))


@given(st.text(), st.integers(1, 64))
def test_log_chunks_never_split_a_character(text, chunk):
    """Read in chunks the way `logs -f` does: the pieces decode to the text, with no replacement marks."""
    from collocate.daemon.views import complete_utf8

    data, offset, out = text.encode(), 0, []
    while offset < len(data):
        piece = complete_utf8(data[offset:offset + max(chunk, 4)])
        out.append(piece.decode())
        offset += len(piece)
    assert "".join(out) == text


def _solo_watch(is_helper=lambda pid: False):
    """One whole GPU and one MIG-like slice (GPU-1 reports a seventh of the SMs), learning."""
    from collocate.core.interference import default_interference

    class Backend(_Backend):
        def devices(self):
            whole = DeviceInfo(GpuId("n", 0), "GPU-0", "A100-40GB", 40000.0, 108)
            part = DeviceInfo(GpuId("n", 1, "1.0"), "GPU-1", "A100-40GB", 5000.0, 14,
                              parent_uuid="GPU-p")
            return [whole, part]

    backend = Backend([])
    params = default_interference().modes[SharingMode.TIME_SLICING]
    return backend, GpuWatch(backend, sharing=SharingMode.TIME_SLICING, params=params, window=5,
                             is_helper=is_helper)


def _reading(uuid, sm, *procs, dram=0.3):
    return DeviceSample(uuid, 0.0, 1000, 39000, sm_activity=sm, dram_activity=dram,
                        processes=tuple(ProcessUsage(pid, mib) for pid, mib in procs))


def test_the_watch_learns_a_jobs_activity_once_its_steps_show_and_the_mps_server_is_no_neighbour():
    from collocate.core.world import MIN_SEGMENT_SAMPLES, Phase

    backend, watch = _solo_watch(is_helper=lambda pid: pid == 99)
    watch.place(Job("1", mem_mib=6000, mem_source="declared"), ("GPU-0",), 0.0)
    now = 0.0

    def feed(*readings):
        nonlocal now
        for r in readings:
            backend.samples = [r]
            now += 1.0
            watch.read()
            watch.observe({"1": frozenset({10})}, now=now)

    feed(*[_reading("GPU-0", 0.01, (10, 900))] * 15)  # first steps: held, below the onset step
    job = watch.resident("1")
    assert job.phase is Phase.WARMING and job.pricing.source == "assumed"
    feed(*[_reading("GPU-0", 0.6, (10, 900), (99, 66))] * (MIN_SEGMENT_SAMPLES + 2))  # the MPS server is no neighbour
    assert job.phase is Phase.ACTIVE and watch.other_mib["GPU-0"] == 0.0
    assert job.pricing.source == "measured" and job.pricing.profile.sm_activity == pytest.approx(0.6, abs=0.03)
    assert watch.snapshot(now).sm_sum[0] == pytest.approx(job.pricing.profile.sm_activity)


def test_the_watch_does_not_learn_on_a_mig_slice():
    backend, watch = _solo_watch()
    watch.place(Job("1", mem_mib=3000, mem_source="declared"), ("GPU-1",), 0.0)
    backend.samples = [_reading("GPU-1", 1.0, (10, 900))]
    for t in range(30):
        watch.read()
        watch.observe({"1": frozenset({10})}, now=float(t))
    job = watch.resident("1")
    assert job.ramp.peak_mib == 900 and job.pricing.source == "assumed"


def test_is_mps_server_reads_the_process_name(tmp_path):
    """A real process named as the MPS server is recognised; this one and a gone pid are not."""
    import subprocess

    from collocate.gpus.mps import SERVER_COMM, is_mps_server

    rename = ("import ctypes, sys, time; ctypes.CDLL(None).prctl(15, sys.argv[1].encode(), 0, 0, 0);"
              " print(flush=True); time.sleep(30)")
    proc = subprocess.Popen([sys.executable, "-c", rename, SERVER_COMM], stdout=subprocess.PIPE)
    try:
        proc.stdout.readline()
        assert is_mps_server(proc.pid)
        assert not is_mps_server(os.getpid())
    finally:
        proc.kill()
        proc.wait()
    assert not is_mps_server(proc.pid)  # reaped: no such process


def test_the_rights_table_in_the_docs_is_the_one_in_the_code():
    """docs/security.md prints ``rights.RIGHTS`` row for row: a rule changed in one place only
    fails here."""
    import re
    from pathlib import Path

    from collocate.wire.protocol import OPS
    from collocate.wire.rights import RIGHTS

    doc = (Path(__file__).parents[2] / "docs" / "security.md").read_text()
    rows = dict(re.findall(r"^\| `(\w+)` \| ([^|]+) \|", doc, flags=re.MULTILINE))
    assert {op: who.strip() for op, who in rows.items()} == {op: str(who) for op, (who, _) in RIGHTS.items()}
    assert set(OPS) == set(RIGHTS)


def test_what_another_member_sees_of_a_failed_job():
    from collocate.wire.rights import public_reason, redact

    assert public_reason("exited with status 1: password=hunter2") == "exited with status 1"
    assert public_reason("could not start the job: [Errno 2] /home/ann/x") == "could not start the job"
    assert public_reason("waits for job 3") == "waits for job 3"
    shown = redact({"id": "1", "argv": ["x", "--key", "s"], "cwd": "/home/ann", "reason": "exited with status 2: s",
                    "attempts": [{"n": 1, "reason": "exited with status 2: s", "dir": "/state/jobs/1"}]})
    assert "argv" not in shown and "cwd" not in shown and "s" not in shown["reason"].split(" ")
    assert shown["attempts"][0]["reason"] == "exited with status 2" and shown["attempts"][0]["dir"] is None
    # show of another's job: what ls shows, never its identity, runner pid or samples (issue 36)
    seen = redact({"id": "1", "name": "t", "identity": "ab12", "summary": {"samples": 9},
                   "profile": {"sm_activity": 0.5}, "series": [1], "notify": ["mail"],
                   "attempts": [{"n": 1, "pid": 4242, "pid_started": 1.0, "runners": [[4242, 1.0]],
                                 "uuids": ["GPU-x"], "solo_sm": 0.3, "outcome": "done"}]})
    assert set(seen) == {"id", "name", "reason", "attempts", "redacted"}
    assert "4242" not in json.dumps(seen) and seen["attempts"][0]["outcome"] == "done"
    # a frozen job shows suspended to every member, as squeue's ST S does (issue 35)
    frozen = redact({"id": "2", "state": "running", "suspended": "preempt", "suspended_at": 1.0,
                     "suspended_why": "for job 3 of higher priority (5 > 0); thaws when it ends",
                     "reason": "for job 3 of higher priority (5 > 0); thaws when it ends; suspended since 10:00:00"})
    assert frozen["suspended"] == "preempt" and frozen["suspended_at"] == 1.0
    assert frozen["reason"].startswith("for job 3 of higher priority")


def test_log_keepers_share_a_members_ledger_and_cut_at_zero(tmp_path):
    """Two streams (two jobs of one member) take from one ledger: what they write together
    stops at what the member had left, and the cut is said in the log (issue 36)."""
    from collocate.node.logkeeper import Ledger, _Stream, write_ledger

    path = tmp_path / "ledger"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    write_ledger(fd, 100_000)
    os.close(fd)
    streams = []
    for name in ("one", "two"):
        out = os.open(tmp_path / f"{name}.log", os.O_WRONLY | os.O_CREAT, 0o600)
        streams.append((_Stream("stdout", out, 1 << 40), Ledger(str(path))))
    for _ in range(4):
        for stream, ledger in streams:
            stream.take(b"\x01" * 20_000, None, 0, ledger)
    for stream, ledger in streams:
        stream.close()
        ledger.close()
    texts = [(tmp_path / f"{n}.log").read_bytes() for n in ("one", "two")]
    assert sum(t.count(b"\x01") for t in texts) == 100_000 + sum(len(s.tail) for s, _ in streams)
    assert all(b"storage quota" in t for t in texts)
    assert Ledger(None).take(5) == 5  # no ledger: no quota


def test_a_drained_ledger_stops_its_member_between_counts(tmp_path):
    """``Accounts.drained``: a member whose keepers took the last of their ledger is stopped
    without a count (a job that filled the quota and ended lets no other start); a member with
    room, or with no ledger yet, is not."""
    from collocate.daemon.quotas import Accounts, Quotas
    from collocate.node.logkeeper import write_ledger

    accounts = Accounts(Quotas(max_stored=2**20), tmp_path, db=None, owner_uid=0)
    (tmp_path / "quota").mkdir()
    for uid, left in ((1001, 0), (1002, 4096), (1003, -5)):
        fd = os.open(tmp_path / "quota" / str(uid), os.O_RDWR | os.O_CREAT, 0o600)
        write_ledger(fd, left)
        os.close(fd)
    stopped = accounts.drained({1001: "ann", 1002: "bob", 1003: "cy", 1004: "dee", 0: "root"})
    assert sorted(stopped) == ["ann", "cy"] and "collocate purge" in stopped["ann"]


def test_a_members_queue_is_counted_only_for_members(tmp_path):
    """``Accounts.check_submit`` asks how many jobs are queued (a walk over every job) only of
    a member, whom ``max_queued`` bounds: the owner's 10,000 submits counted the whole queue
    each time, for a bound that does not apply to them."""
    from collocate.daemon.quotas import Accounts, Quotas

    asked: list[int] = []

    def queued() -> int:
        asked.append(1)
        return 3

    accounts = Accounts(Quotas(max_queued=3), tmp_path, db=None, owner_uid=1000)
    for owner in (1000, 0):
        accounts.check_submit(owner, 100, queued)
    assert asked == []
    with pytest.raises(InputError, match="3 jobs queued") as refused:
        accounts.check_submit(1001, 100, queued)
    assert asked == [1] and "--user-max-queued" in (refused.value.hint or "")


def test_one_member_can_never_bring_the_disk_to_its_reserve():
    from collocate.daemon.quotas import Quotas

    mib = 2**20
    q = Quotas(max_stored=1 << 40).resolved(64 * mib)  # the owner asked for too much
    assert q.max_stored is not None and q.disk_reserve is not None
    assert q.max_stored <= (64 * mib - q.disk_reserve) // 2
    assert Quotas().resolved(64 * mib).max_stored == 16 * mib  # the default: a quarter


@given(st.lists(st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,8}=[^\s]{0,12}", fullmatch=True), min_size=1, max_size=3),
       st.sampled_from(["sleep 300", "python t.py", "", "./run.sh --key=v"]))
def test_a_default_name_never_holds_an_inline_assignment(assignments, rest):
    name = default_name(["bash", "-c", " ".join([*assignments, rest])])
    assert "=" not in name and not any(a in name for a in assignments)


def test_output_files_go_to_rank_0s_runner_truncated_first_then_appended():
    from collocate.daemon.plan import Rendezvous, output_args

    job = Job("7", name="a1", user="ann", sweep="5")
    spec = JobSpec(("x",), "/w", user="ann", output="/w/%x-%j-%A.out", error="/w/%u-%%.err")
    assert output_args(job, spec, 1, None) == ("--output", "/w/a1-7-5.out", "--error", "/w/ann-%.err")
    assert output_args(job, spec, 2, Rendezvous(2, 0, "h", 1))[-1] == "--append"
    assert output_args(job, spec, 1, Rendezvous(2, 1, "h", 1)) == ()  # rank 1 writes no file
    assert output_args(job, JobSpec(("x",), "/w"), 3, None) == ()


@given(mem=st.one_of(st.none(), st.floats(100.0, 80_000.0)), room=st.floats(-1_000.0, 80_000.0),
       opted_out=st.booleans(), lifted=st.booleans(), alone=st.booleans(),
       source=st.sampled_from(["declared", "estimated", "measured", "oom-raised"]))
def test_show_says_a_running_job_is_fenced_exactly_when_its_runner_is_given_a_fence(mem, room, opted_out, lifted,
                                                                                    alone, source):
    # issue 35: `show` says whether a job is fenced, and why not; it must be what the runner enforces
    from types import SimpleNamespace

    from collocate.daemon.plan import fence_env
    from collocate.daemon.views import fence_line

    job = Job("7", state=JobState.RUNNING, mem_mib=mem, mem_source=source if mem is not None else "unknown",
              mem_fence=not opted_out, fence_lifted=lifted, alone=alone)
    placement = Placement("7", (GpuId("n", 0),), room if mem is None else mem, room)  # as ``Ledger.place`` gives it
    env = fence_env(job, placement)
    line = fence_line(job, SimpleNamespace(job=job, room_mib=placement.room_mib))  # the world's resident
    if "COLLOCATE_MEM_FENCE_MIB" in env:
        assert line.startswith("fenced at ") and " per GPU" in line, (line, env)
    else:
        assert line.startswith("not fenced: "), (line, env)
