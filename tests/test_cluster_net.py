"""`make cluster CLUSTER_NET=lan`: segment servers in network namespaces of their own, behind
shaped links (`madlib_mop.tools.cluster_net`), in a folder (.cluster/net) and on ports of this module's own.
The cluster starts, a job's states travel between the namespaces, and stopping it leaves
no namespace, link or server."""

from __future__ import annotations

import os
import shutil

import psycopg
import pytest

from madlib_mop.tools import cluster_net, local_cluster
from tests.conftest import _server_kind, free_port_block
from tests.test_cluster import _fit, _hops, _visits, _walkthrough_data

SEGMENTS = ["seg0", "seg1"]

pytestmark = pytest.mark.skipif(_server_kind() != "embedded",
                                reason="starts PostgreSQL servers of its own in network namespaces")


@pytest.fixture(scope="module")
def networked(monkeypatch_module):
    if os.geteuid() != 0 or not (shutil.which("ip") and shutil.which("tc")):
        pytest.skip("network namespaces need root, iproute2 and tc")
    if cluster_net.made(SEGMENTS):
        pytest.skip("a cluster in network namespaces (make cluster CLUSTER_NET=...) is running")
    monkeypatch_module.setenv(cluster_net.VARIABLE, "lan")
    # (under the cluster's folder: the servers' OS user reaches it)
    found = local_cluster.servers(free_port_block(3), base=local_cluster.BASE / "net")
    for server in found.values():  # (new servers: nothing of an earlier run)
        server.destroy()
    try:
        local_cluster.start(found)
        yield found
    finally:
        local_cluster.stop(found)
        for server in found.values():
            server.destroy()


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def test_a_cluster_in_network_namespaces_trains_and_stops_cleanly(networked):
    """Each segment server answers at its namespace's address alone; a job's states travel
    between the namespaces, server to server; stopping the cluster leaves no namespace, no
    link and no server running."""
    coordinator = local_cluster._dsn_with_password(networked["coordinator"])
    for index, name in enumerate(SEGMENTS):
        with psycopg.connect(local_cluster._dsn_with_password(networked[name])) as there:
            assert str(there.execute("SELECT inet_server_addr()").fetchone()[0]) == cluster_net.address(index)
        with pytest.raises(psycopg.OperationalError):  # (not on this namespace's loopback)
            psycopg.connect(f"host=127.0.0.1 port={networked[name].port} dbname=postgres user=postgres "
                            "password=x connect_timeout=2")
    _walkthrough_data(coordinator, local=False)
    _fit(coordinator, "net_model")
    moved = [result for (*_, result), before in _hops(_visits(coordinator, "net_model"))
             if result["kept_on"] != before["kept_on"]]
    assert moved and all(result["fetched_bytes"] > 0 and result["coordinator_bytes"] == 0 for result in moved)
    assert cluster_net.made(SEGMENTS)
    local_cluster.stop(networked)
    assert cluster_net.made(SEGMENTS) == []
    assert not any(server.is_running() for server in networked.values())
