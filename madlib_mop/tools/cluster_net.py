"""A network for `make cluster` (`CLUSTER_NET=lan` or `wan`): each segment server in a
network namespace of its own, with an address of its own, as on a machine of its own.

    this machine's namespace (coordinator) --veth-- [mop-switch: bridge] --veth-- mop-seg0
                                                                          \\--veth-- mop-seg1

A namespace `mop-switch` holds a bridge that every segment server's namespace and this
machine's namespace join by a veth pair, as machines join a switch: the coordinator
reaches a segment server over its link, a segment server reaches another over both of
theirs.  `tc` shapes each segment server's link in both directions: its rate, and its delay
where the kernel has the `netem` queueing discipline (without it, the rate alone, with
`tbf`, and the set-up says so).  The addresses (10.213.0.0/24) and the traffic stay inside
namespaces this machine makes; `down` removes every namespace and link it made.

On real machines the same is a network between hosts: each segment server's
`listen_addresses` and `pg_hba.conf` admit the coordinator and the other segment servers
(docs/several-servers.md).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass

from madlib_mop.tools.embedded import ClusterError, EmbeddedCluster

VARIABLE = "MADLIB_MOP_CLUSTER_NET"  # `make cluster CLUSTER_NET=...` sets it


@dataclass(frozen=True)
class Profile:
    rate: str  # tc's form: 10gbit
    delay: str  # one way, per link: 0.1ms

    def describe(self) -> str:
        return f"{self.rate}, {self.delay} each way per link"


# A round trip between two segment servers crosses two links each way: lan's 0.1 ms per
# link and way is 0.4 ms (a switched LAN's); wan's 2.5 ms is 10 ms.
PROFILES = {"lan": Profile("10gbit", "0.1ms"), "wan": Profile("1gbit", "2.5ms")}
SWITCH = "mop-switch"
BRIDGE = "mopbridge"
HOST_LINK = "mopnethost"
HOST_ADDRESS = "10.213.0.1"
PREFIX = 24


def profile() -> tuple[str, Profile] | None:
    """The profile MADLIB_MOP_CLUSTER_NET names (None: off, the loopback)."""
    name = (os.environ.get(VARIABLE) or "off").strip().lower()
    if name in ("", "off", "none"):
        return None
    if name not in PROFILES:
        raise ClusterError(f"{VARIABLE}={name!r}: expected one of off, {', '.join(PROFILES)}")
    return name, PROFILES[name]


def address(index: int) -> str:
    """Segment server `index`'s address, in its namespace."""
    return f"10.213.0.{10 + index}"


def namespace(name: str) -> str:
    return f"mop-{name}"


def _ip(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(["ip", *argv], capture_output=True, text=True)
    if check and result.returncode != 0:
        raise ClusterError(f"ip {' '.join(argv)}: {result.stderr.strip()}")
    return result


def _in(space: str, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
    return _ip("netns", "exec", space, *argv, check=check)


def _namespaces() -> set[str]:
    return {line.split()[0] for line in _ip("netns", "list").stdout.splitlines() if line.strip()}


def _shape(space: str | None, device: str, wanted: Profile) -> bool:
    """The device's egress at the profile's rate and delay (netem); without netem, its rate
    (tbf).  False: no delay."""
    run = (lambda *a: _in(space, *a, check=False)) if space else (lambda *a: subprocess.run(
        list(a), capture_output=True, text=True))
    if run("tc", "qdisc", "replace", "dev", device, "root", "netem", "delay", wanted.delay,
           "rate", wanted.rate, "limit", "100000").returncode == 0:
        return True
    result = run("tc", "qdisc", "replace", "dev", device, "root", "tbf", "rate", wanted.rate,
                 "burst", "4mb", "latency", "50ms")
    if result.returncode != 0:
        raise ClusterError(f"tc on {device}: {result.stderr.strip()}")
    return False


def up(names: list[str], name: str, wanted: Profile) -> str:
    """The switch, and a namespace per segment server (`names`) joined to it by a link
    shaped as `wanted` (idempotent: what exists is made again).  What was set, said."""
    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None:
        raise ClusterError(f"{VARIABLE}={name} needs root, iproute2 and tc (network namespaces)")
    down(names)
    _ip("netns", "add", SWITCH)
    _in(SWITCH, "ip", "link", "add", BRIDGE, "type", "bridge")
    _in(SWITCH, "ip", "link", "set", BRIDGE, "up")
    _join(None, HOST_LINK, HOST_ADDRESS)
    delays = [_join(namespace(server), f"mopnet{index}", address(index), wanted)
              for index, server in enumerate(names)]
    said = f"segment servers in network namespaces, each link {wanted.describe()}"
    return said if all(delays) else (f"segment servers in network namespaces, each link {wanted.rate} "
                                     "(this kernel has no netem queueing discipline: no delay)")


def _join(space: str | None, link: str, at: str, wanted: Profile | None = None) -> bool:
    """A veth pair from `space` (None: this namespace) to the switch's bridge; `at` its
    address there; both ends shaped as `wanted`.  False: shaped without delay."""
    port = f"{link}s"
    _ip("link", "add", link, "type", "veth", "peer", "name", port)
    _ip("link", "set", port, "netns", SWITCH)
    _in(SWITCH, "ip", "link", "set", port, "master", BRIDGE)
    _in(SWITCH, "ip", "link", "set", port, "up")
    if space is not None:
        _ip("netns", "add", space)
        _ip("link", "set", link, "netns", space)
        _in(space, "ip", "link", "set", "lo", "up")
    run = (lambda *a: _in(space, *a)) if space else (lambda *a: _ip(*a[1:]))
    run("ip", "addr", "add", f"{at}/{PREFIX}", "dev", link)
    run("ip", "link", "set", link, "up")
    if wanted is None:
        return True
    return _shape(space, link, wanted) & _shape(SWITCH, port, wanted)


def down(names: list[str]) -> None:
    """Every namespace and link `up` made (those that exist)."""
    if shutil.which("ip") is None:  # (then none was made)
        return
    spaces = _namespaces()
    for server in names:
        if namespace(server) in spaces:
            _ip("netns", "del", namespace(server), check=False)
    _ip("link", "del", HOST_LINK, check=False)
    if SWITCH in spaces:
        _ip("netns", "del", SWITCH, check=False)


def made(names: list[str]) -> list[str]:
    """What of the network exists (namespaces and this namespace's link): none after `down`."""
    spaces = _namespaces()
    found = [space for space in [SWITCH, *map(namespace, names)] if space in spaces]
    if _ip("link", "show", HOST_LINK, check=False).returncode == 0:
        found.append(HOST_LINK)
    return found


def shaping(name: str, index: int) -> str:
    """How segment server `index`'s link (`name` its server name) is shaped, as tc says."""
    shown = _in(namespace(name), "tc", "qdisc", "show", "dev", f"mopnet{index}", check=False).stdout
    return " ".join(shown.split()[1:2] + shown.split()[6:]) or "not shaped"


class NamespacedServer(EmbeddedCluster):
    """An embedded server whose postmaster runs in a segment server's namespace and listens
    on its address there alone (its Unix socket is a file: the tools reach it as any
    other's), and admits the cluster's subnet."""

    def __init__(self, *args, space: str, at: str, **kwargs):
        super().__init__(*args, **kwargs)
        self.space, self.address, self.listen = space, at, at

    def _as_server_user(self, argv: list[str]) -> list[str]:
        # (a server started before the namespace was, or after it went, is stopped from here)
        if not os.path.exists(f"/run/netns/{self.space}"):
            return super()._as_server_user(argv)
        return ["ip", "netns", "exec", self.space, *super()._as_server_user(argv)]

    def initialize(self, password: str | None = None) -> None:
        super().initialize(password)
        hba = self.data / "pg_hba.conf"
        line = f"host all all {HOST_ADDRESS.rsplit('.', 1)[0]}.0/{PREFIX} scram-sha-256"
        if line not in hba.read_text(encoding="utf-8").splitlines():
            hba.write_text(hba.read_text(encoding="utf-8") + line + "\n", encoding="utf-8")
