"""`dpu run --io afxdp` end to end: the live lab (tests/livelab.py) with AF_XDP queues.

The lab's veths get two queues on both ends (one per worker: AF_XDP binds worker i to queue i;
`set_queues` matches them to the workers of each run), and the ends facing dpu leave no
checksum to offload (`ethtool -K tx off`): XDP takes a frame before the kernel would finish a
checksum a local sender left partial, so without it TCP from a namespace arrives with bad
checksums. Nothing is needed on the peers for the XDP program itself: dpu's program runs on
its own end in native mode (veth enables NAPI for it), and AF_XDP transmits through the
ordinary skb path, not by XDP redirect into the peer (which would need a program or GRO on the
peer).

Needs root and a build with AF_XDP (libxdp-dev, libbpf-dev); skipped with the reason otherwise.
"""
import os
import re
import shutil
import signal
import time

import pytest

if os.geteuid() != 0:
    pytest.skip("AF_XDP tests need root (network namespaces, XDP)", allow_module_level=True)
if not shutil.which("ethtool") or not shutil.which("ping"):
    pytest.skip("AF_XDP tests need ethtool and ping (apt-get install ethtool iputils-ping)", allow_module_level=True)

import dpu._core  # noqa: E402

with open(dpu._core.__file__, "rb") as _so:
    if b"libxdp.so" not in _so.read():
        pytest.skip("this build has no AF_XDP (install libxdp-dev libbpf-dev pkg-config, rebuild)",
                    allow_module_level=True)

from helpers.wait import wait_for  # noqa: E402
from livelab import SERVER_IP, Lab  # noqa: E402
from netns import ip, nsexec, sh  # noqa: E402
AFXDP = ("--io", "afxdp")
MB = 1 << 20


class XdpLab(Lab):
    """The live lab with two-queue veths whose far ends leave no checksum to offload."""

    PEERS = {"vm1": "vm1", "vm2": "vm2", "vm3": "vm3", "p0": "vtep", "inet": "inet"}  # dpu's port: its peer's ns
    queues = 2

    def _veth_add(self, ns_a: str, a: str, ns_b: str, b: str, mac_b: str, mtu: int, at: tuple = ()) -> None:
        q = ("numrxqueues", "2", "numtxqueues", "2")
        sh("ip", "link", "add", "name", a, *at, "netns", ns_a, "mtu", str(mtu), *q, "type", "veth", "peer", "name", b,
           "netns", ns_b, "address", mac_b, "mtu", str(mtu), *q)
        nsexec(ns_b, "ethtool", "-K", b, "tx", "off")

    def set_queues(self, n: int) -> None:
        """n queues on each of dpu's interfaces and on their peers (native XDP on a veth wants its
        receive queues to cover the peer's transmit queues)."""
        if n == self.queues:
            return
        for port, peer in self.PEERS.items():
            nsexec(self.ns["dpu"], "ethtool", "-L", port, "rx", str(n), "tx", str(n))
            nsexec(self.ns[peer], "ethtool", "-L", "eth0", "rx", str(n), "tx", str(n))
        self.queues = n

    def xdp_attached(self) -> list:
        """dpu's interfaces that have an XDP program now."""
        out = ip(self.ns["dpu"], "-o", "link", "show").stdout
        return sorted(re.search(r"^\d+: ([^@:]+)", line).group(1) for line in out.splitlines() if " xdp" in line)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    lab = XdpLab(str(tmp_path_factory.mktemp("afxdp")))
    yield lab
    lab.close()
    assert lab.leftovers() == []


@pytest.fixture(autouse=True)
def no_dpu_left(request):
    """A test that fails half-way leaves no dpu running into the next one."""
    yield
    if "lab" in request.fixturenames:
        lab = request.getfixturevalue("lab")
        for p in lab.procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def tcp_both_ways(lab, port: int, nbytes: int = 8 * MB) -> None:
    """A TCP stream vm1 -> rblue (blue's remote endpoint, over VXLAN), then one back; content checked."""
    for server, client, dst, seen in (("rblue", "vm1", "10.0.0.21", "10.0.0.11"),
                                      ("vm1", "rblue", "10.0.0.11", "10.0.0.21")):
        assert lab.transfer(server, client, dst, port, nbytes) == seen, (client, server)
        port += 1


@pytest.mark.parametrize("workers", [1, 2])
def test_vm_and_remote_endpoint_talk_over_vxlan(lab, workers):
    lab.set_queues(workers)
    d = lab.start_dpu(workers=workers, extra=AFXDP)
    assert lab.xdp_attached() == ["inet", "p0", "vm1", "vm2", "vm3"]
    assert lab.ping("vm1", "10.0.0.21")
    assert lab.ping("rblue", "10.0.0.11")
    tcp_both_ways(lab, 5001)
    st = d.stats()
    p0 = st["ports"]["p0"]
    assert p0["tx_bytes"] > 8 * MB and p0["rx_bytes"] > 8 * MB, "both transfers crossed the uplink"
    assert all(q["rx_ring_drops"] == 0 for q in st["interfaces"]), st["interfaces"]
    rc, out, err = d.stop()
    assert rc == 0 and f"with {workers} worker(s) on afxdp" in out, err
    assert "dpu: note:" not in err, "native XDP with multi-buffer on this kernel"
    assert lab.xdp_attached() == [], "the XDP programs went with the process"


def test_sigterm_under_load_detaches_everything(lab):
    lab.set_queues(2)
    d = lab.start_dpu(workers=2, extra=AFXDP)
    srv, cli = lab.start_transfer("rblue", "vm1", "10.0.0.21", 5301, 40 * MB, 20 * MB)
    try:
        wait_for(lambda: d.stats()["ports"]["vm1"]["rx_packets"] > 100, 60, "the transfer under way through vm1")
        rc, out, err = d.stop(signal.SIGTERM)
        assert rc == 0 and "Traceback" not in err, err
        m = re.search(r"^vm1\s+(\d+)\s+(\d+)", out, re.M)
        assert m and int(m.group(1)) > 100, out
        assert "Interfaces:" in out and "on afxdp" in out
        assert not os.path.exists(d.ctl)
        assert lab.xdp_attached() == []
    finally:
        cli.kill()
        srv.kill()
    # and the interfaces work for the kernel again: nothing of dpu left in their path
    ip(lab.ns["dpu"], "addr", "add", "198.51.100.77/24", "dev", "inet")
    try:
        assert lab.ping("inet", "198.51.100.77", count=1)
    finally:
        ip(lab.ns["dpu"], "addr", "del", "198.51.100.77/24", "dev", "inet")


def test_queues_and_workers_are_checked_before_start(lab, tmp_path):
    lab.set_queues(1)
    topo = lab.topology()
    ctl = str(tmp_path / "x.ctl")
    r = lab.run_dpu("--config", topo, "--port", "vm1=vm1", "--workers", "2", "--ctl", ctl, *AFXDP)
    assert r.returncode == 1 and r.stderr.strip() == (
        "dpu: LiveError: port vm1: interface vm1 has 1 queue(s), --workers 2 needs 2 with --io afxdp "
        "(one queue per worker): ethtool -L vm1 combined 2 (veth: rx 2 tx 2, and the same on its peer)"), r.stderr
    assert not os.path.exists(ctl) and lab.xdp_attached() == []
    # More queues than workers: every queue is bound (queue q on worker q mod N), so flows the
    # far end hashes onto either queue all get through one worker.
    lab.set_queues(2)
    d = lab.start_dpu(workers=1, extra=AFXDP)
    lab.peer("inet", "udp-echo", "6013", SERVER_IP)
    answers = [lab.udp_ask("vm1", SERVER_IP, 6013, f"q{i}") for i in range(12)]
    stats = nsexec(lab.ns["dpu"], "ethtool", "-S", "vm1").stdout
    redirected = [int(re.search(rf"rx_queue_{q}_xdp_redirect: (\d+)", stats).group(1)) for q in (0, 1)]
    rc, _, err = d.stop()
    assert rc == 0 and "warning" not in err, err
    assert all(a.startswith("203.0.113.10:") for a in answers), answers
    assert all(n > 0 for n in redirected), f"both of vm1's queues went to dpu: {redirected}"


def test_interface_down_and_up_while_running(lab):
    lab.set_queues(1)
    d = lab.start_dpu(extra=AFXDP)
    assert lab.ping("rblue", "10.0.0.11")
    ip(lab.ns["dpu"], "link", "set", "vm1", "down")
    try:
        assert not lab.ping("rblue", "10.0.0.11", count=3)
        assert d.stats()["ports"]["vm1"]["tx_dropped"] >= 2, "what could not be sent is counted"
        assert d.proc.poll() is None
    finally:
        ip(lab.ns["dpu"], "link", "set", "vm1", "up")
    assert any(lab.ping("rblue", "10.0.0.11", count=1) for _ in range(20)), "traffic resumes"
    assert lab.ping("rblue", "10.0.0.11")
    d.stop()


def _remake_vm1(lab, queues: int) -> None:
    """vm1 made again with `queues` queues in use on both ends (of the two it may have)."""
    def channels(ns, dev):
        for where, name in ((ns, dev), (lab.ns["vm1"], "eth0")):
            nsexec(where, "ethtool", "-L", name, "rx", str(queues), "tx", str(queues))
    lab.remake_vm("vm1", setup=channels)


def test_interface_created_again_is_reattached(lab):
    """The VM's interface deleted and made again under the same name: dpu binds a new AF_XDP
    socket to it (the XDP program attached to the new interface) and traffic goes on. One
    that comes back with other queues than dpu started with is refused with a warning, once,
    and taken when it comes back as it was."""
    lab.set_queues(1)
    d = lab.start_dpu(extra=AFXDP)
    try:
        assert lab.ping("rblue", "10.0.0.11")
        _remake_vm1(lab, 1)
        assert any(lab.ping("rblue", "10.0.0.11", count=1) for _ in range(20)), "traffic reaches the new interface"
        assert "vm1" in lab.xdp_attached()
        tcp_both_ways(lab, 5301, 2 * MB)
        _remake_vm1(lab, 2)
        # Not a wait for anything: dpu tries again every second, and one that warned on each try
        # would have said it more than once in this time (a correct one passes however slow).
        time.sleep(2.5)
        assert d.proc.poll() is None
        _remake_vm1(lab, 1)
        assert any(lab.ping("rblue", "10.0.0.11", count=1) for _ in range(20)), "taken when it is back as it was"
        # Moved to another namespace and back: its program goes with it, its socket is unbound.
        ip(lab.ns["dpu"], "link", "set", "vm1", "netns", lab.ns["inet"])
        ip(lab.ns["inet"], "link", "set", "vm1", "netns", lab.ns["dpu"])
        ip(lab.ns["dpu"], "link", "set", "vm1", "up")
        assert any(lab.ping("rblue", "10.0.0.11", count=1) for _ in range(20)), "bound again after a move and back"
    finally:
        rc, _, err = d.stop()
    assert rc == 0
    assert err.count("interface vm1 was created again: reattached") == 3, err
    assert err.count("dpu: warning: interface vm1 (queue 0) was created again; not reattached: it has 2 queue(s), "
                     "dpu started with 1 (restart dpu to use them)") == 1, err
    assert lab.xdp_attached() == [], "the new interface's program is detached at exit too"


def test_generic_xdp_when_the_driver_refuses_native(lab):
    lab.set_queues(1)
    nsexec(lab.ns["vm1"], "ethtool", "-L", "eth0", "tx", "2")  # veth: native XDP wants rx queues >= the peer's tx
    try:
        d = lab.start_dpu(extra=AFXDP)
        notes = [line.split(" dpu: info: ", 1)[1].strip() for line in d.stderr_lines if " dpu: info: interface vm1 queue" in line]
        assert notes == ["interface vm1 queue 0: AF_XDP, generic XDP (SKB mode: native attach failed: "
                         "No space left on device, veth: its peer transmits on more queues than this end receives "
                         "on), copy mode, multi-buffer (jumbo frames)"], d.stderr_lines
        assert "xdpgeneric" in ip(lab.ns["dpu"], "link", "show", "vm1").stdout
        assert lab.ping("vm1", "10.0.0.21")
        tcp_both_ways(lab, 5401, 1 * MB)
        assert d.stop()[0] == 0
        assert lab.xdp_attached() == []
    finally:
        nsexec(lab.ns["vm1"], "ethtool", "-L", "eth0", "tx", "1")


def test_jumbo_frames_over_a_jumbo_underlay(tmp_path):
    lab = XdpLab(str(tmp_path), underlay_mtu=9266)  # VMs get 9216: several UMEM chunks a frame
    try:
        lab.set_queues(1)
        d = lab.start_dpu(extra=AFXDP)
        assert lab.ping("vm1", "10.0.0.21", size=9216 - 28, df=True), "a 9,216-byte IP packet, both ways"
        tcp_both_ways(lab, 5201)
        st = d.stats()
        assert not any(st["ports"][p]["drops"] for p in ("p0", "vm1")), st["ports"]
        assert all(q["rx_ring_drops"] == q["tx_refused"] == 0 for q in st["interfaces"]), st["interfaces"]
        assert d.stop()[0] == 0
    finally:
        lab.close()
    assert lab.leftovers() == []
