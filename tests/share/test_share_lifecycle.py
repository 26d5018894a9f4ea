"""The daemon-facing lifecycle API and the CLI, with real producer subprocesses."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from collocate.common.errors import InputError
from collocate.share import SharedLoader, naming
from collocate.share.errors import ProducerExistsError, ProducerLostError
from collocate.share.lifecycle import ProducerSpec, probe, start_producer

HERE = Path(__file__).parent


def test_spec_argv_is_the_exact_command(state_dir) -> None:
    spec = ProducerSpec("pkg.data:make", "cifar-train", state_dir=state_dir, slots=4, python="python3")
    assert spec.argv() == ["python3", "-m", "collocate.share", "serve", "pkg.data:make", "--name", "cifar-train",
                           "--slots", "4", "--stall-timeout", "10.0", "--consumer-timeout", "5.0",
                           "--device", "cpu", "--state-dir", state_dir]
    with pytest.raises(InputError, match="invalid shared dataset name"):
        ProducerSpec("pkg.data:make", "bad name/")
    with pytest.raises(InputError, match="module:callable"):
        ProducerSpec("pkg.data.make", "ok")


def test_start_ready_consume_stop(state_dir, tmp_path) -> None:
    spec = ProducerSpec("_share_workers:default_loader", "life", state_dir=state_dir, slots=4)
    handle = start_producer(spec, cwd=HERE, log_path=tmp_path / "producer.log")
    try:
        status = handle.wait_ready(timeout=60)
        assert status.ready and status.pid == handle.pid and status.name == "life"
        shown = subprocess.run([sys.executable, "-m", "collocate.cli", "share", "status", "life", "--state-dir",
                                state_dir, "--format", "json"], check=True, capture_output=True, text=True, timeout=60)
        seen = json.loads(shown.stdout)
        assert (seen["name"], seen["pid"], seen["ready"], seen["consumers"], seen["error"]) == (
            "life", handle.pid, True, 0, None)
        assert seen["batches"] >= 1 and isinstance(seen["samples"], int)  # the first batch is in the ring
        with pytest.raises(ProducerExistsError):
            start_producer(spec, cwd=HERE)
        with SharedLoader("life", 10, state_dir=state_dir) as loader:
            ids = [i for batch in loader for i in batch["id"].tolist()]
        assert sorted(ids) == list(range(103))
    finally:
        code = handle.stop(timeout=10)
    assert code == 0, (tmp_path / "producer.log").read_text()
    assert probe("life", state_dir) is None
    assert not naming.address_is_bound(naming.socket_address("life", state_dir))


def test_a_broken_factory_is_reported_not_awaited(state_dir, tmp_path) -> None:
    handle = start_producer(ProducerSpec("_share_workers:no_such_loader", "broken", state_dir=state_dir), cwd=HERE,
                            log_path=tmp_path / "p.log")
    with pytest.raises(ProducerLostError, match="exited with code 2"):
        handle.wait_ready(timeout=60)
    assert "no attribute 'no_such_loader'" in (tmp_path / "p.log").read_text()


def test_names_are_scoped_by_state_directory(tmp_path) -> None:
    a = naming.socket_address("x", tmp_path / "a")
    assert a != naming.socket_address("x", tmp_path / "b") and a.startswith("\0collocate/share/")
    assert a == naming.socket_address("x", tmp_path / "a")


def test_cli_status_without_a_producer(state_dir) -> None:
    out = subprocess.run([sys.executable, "-m", "collocate.cli", "share", "status", "nobody", "--state-dir",
                          state_dir], check=False, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "no producer serves 'nobody'" in out.stdout
    out = subprocess.run([sys.executable, "-m", "collocate.cli", "share", "status", "nobody", "--state-dir",
                          state_dir, "--format", "json"], check=False, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and json.loads(out.stdout) is None
