"""A local Ray cluster for the whole session, and collocate heads on it as real subprocesses.

The cluster (``ray.cluster_utils.Cluster``: each node's raylet a process of its own, so a test
can SIGKILL one) has a Ray head node that carries no ``collocate`` resource and three collocate
nodes, ``n1``..``n3``, started one after another (concurrent starts time out on a small
machine). Each collocate node runs an agent with 2 emulated A100s. The tests that use it are
skipped, with the reason, only where Ray is not installed (``pip install 'collocate[ray]'``; CI
installs it); the agent's and the seam's own tests need no Ray.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent / "daemon"))
import daemon_harness  # noqa: E402 - the daemon tests' harness: real `collocate serve` processes
from daemon_harness import Daemon  # noqa: E402

# Ray reads its token once per process: set before anything here imports Ray (the heads, as
# children, inherit both).
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ["RAY_AUTH_MODE"] = "token"
os.environ.setdefault("RAY_AUTH_TOKEN", secrets.token_hex(32))

NODES = ("n1", "n2", "n3")
GPUS = "emulated:2xA100-40GB"


class LocalCluster:
    """The session's Ray cluster, set up as docs/multi-node.md says: token authentication on
    every node (``RAY_AUTH_MODE=token``, a random token in ``RAY_AUTH_TOKEN``, which the heads
    inherit) and Ray's temporary folder under a folder only root may enter. ``kill``/``start``
    a collocate node by name."""

    def __init__(self) -> None:
        import ray._common.utils
        from ray.cluster_utils import Cluster

        self.private = Path(tempfile.mkdtemp(prefix="collocate-ray-"))  # 0700, root's
        self.temp_dir = self.private / "tmp"
        # cluster_utils writes the address file under Ray's default folder whatever temp_dir is
        os.makedirs(ray._common.utils.get_default_ray_temp_dir(), exist_ok=True)
        self.cluster = Cluster(initialize_head=True, head_node_args=dict(
            num_cpus=0, num_gpus=0, object_store_memory=80 * 2**20, include_dashboard=False,
            temp_dir=str(self.temp_dir)))
        self.address = self.cluster.address
        self.nodes: dict[str, object] = {}
        for name in NODES:
            self.start(name)

    def start(self, name: str) -> None:
        self.nodes[name] = self.cluster.add_node(
            num_cpus=1, num_gpus=0, object_store_memory=80 * 2**20,
            resources={"collocate": 1}, labels={"collocate-node": name})

    def kill(self, name: str) -> None:
        """SIGKILL every Ray process of node ``name`` (raylet, workers, its agent)."""
        self.cluster.remove_node(self.nodes.pop(name), allow_graceful=False)

    def shutdown(self) -> None:
        self.cluster.shutdown()
        shutil.rmtree(self.private, ignore_errors=True)


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[LocalCluster]:
    pytest.importorskip("ray", reason="the cluster tests need Ray: pip install 'collocate[ray]'")
    cluster = LocalCluster()
    yield cluster
    cluster.shutdown()


@pytest.fixture
def heads(tmp_path: Path, ray_cluster: LocalCluster,
          monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Daemon]]:
    """``collocate serve --ray`` heads; at teardown each is SIGKILLed and every job process group
    its agents launched (from the runners' and producers' records on each node's root) is killed too."""
    started: list[Daemon] = []
    monkeypatch.setattr(daemon_harness, "START_TIMEOUT_S", 120.0)  # connect, seat three agents

    def make(*args: str, name: str = "head", grace: float = 60.0) -> Daemon:
        d = Daemon(tmp_path / name, ["--ray", ray_cluster.address, "--gpus", GPUS, "--period", "0.2",
                                     "--node-grace-s", str(grace), *args])
        started.append(d)
        return d.start()

    yield make
    for d in started:
        d.kill()
        records = [*d.state_dir.glob("nodes/*/jobs/*/attempt-*/runner.json"),
                   *d.state_dir.glob("nodes/*/share/*.pid")]  # runners, dataset producers
        for record in records:
            try:
                os.killpg(int(json.loads(record.read_text())["pid"]), signal.SIGKILL)
            except (ProcessLookupError, PermissionError, ValueError, KeyError):
                pass
        d.remove_cgroups()
