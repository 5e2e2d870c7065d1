"""`dpu run` end to end: real Linux hosts in namespaces, Linux's own VXLAN as the remote VTEP,
real TCP and UDP through the overlay and the NAT, the control socket, metrics, ARP, signals.

Needs root (namespaces, AF_PACKET) and ethtool; skipped with the reason otherwise.
"""
import json
import os
import re
import shutil
import signal
import stat
import struct
import subprocess
import sys
import time

import pytest
import yaml

from helpers.wait import wait_for
from netns import Capture, ip, nsexec, sh

if os.geteuid() != 0:
    pytest.skip("live tests need root (network namespaces, AF_PACKET)", allow_module_level=True)
if not shutil.which("ethtool") or not shutil.which("ping"):
    pytest.skip("live tests need ethtool and ping (apt-get install ethtool iputils-ping)", allow_module_level=True)

from livelab import INET_ROUTER_MAC, ROOT, SERVER_IP, VTEP_MAC, Lab  # noqa: E402

MB = 1 << 20


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    lab = Lab(str(tmp_path_factory.mktemp("live")))
    yield lab
    lab.close()
    assert lab.leftovers() == []


def run_cli(*args, check=True):
    r = subprocess.run([sys.executable, "-m", "dpu.cli", *args], capture_output=True, text=True, timeout=60, cwd=ROOT)
    if check:
        assert r.returncode == 0, (args, r.stdout, r.stderr)
    return r


def vxlan_of(frame: bytes):
    """(outer src, outer dst, VNI) of an Ethernet/IPv4/UDP 4789 frame, else None."""
    if len(frame) < 50 or frame[12:14] != b"\x08\x00" or frame[23] != 17:
        return None
    ihl = (frame[14] & 15) * 4
    udp = 14 + ihl
    if struct.unpack("!H", frame[udp + 2:udp + 4])[0] != 4789:
        return None
    src, dst = frame[26:30], frame[30:34]
    vni = int.from_bytes(frame[udp + 12:udp + 15], "big")
    return ".".join(map(str, src)), ".".join(map(str, dst)), vni


# ---- the overlay -----------------------------------------------------------------------------

@pytest.mark.parametrize("workers", [1, 2])
def test_vm_and_remote_endpoint_talk_over_vxlan(lab, workers):
    d = lab.start_dpu(workers=workers)
    assert lab.ping("vm1", "10.0.0.21")
    assert lab.ping("rblue", "10.0.0.11")
    assert lab.transfer("rblue", "vm1", "10.0.0.21", 5001, 8 * MB) == "10.0.0.11"
    assert lab.transfer("vm1", "rblue", "10.0.0.11", 5002, 8 * MB) == "10.0.0.21"
    st = d.stats()
    p0, vm1 = st["ports"]["p0"], st["ports"]["vm1"]
    assert p0["tx_bytes"] > 8 * MB and p0["rx_bytes"] > 8 * MB, "both transfers crossed the uplink"
    assert vm1["rx_bytes"] > 8 * MB and vm1["tx_bytes"] > 8 * MB
    assert len(st["workers"]) == workers + 1  # worker 0 serves the API
    assert sum(w["packets"] for w in st["workers"][1:]) == st["workers_total"]["packets"] and st["workers"][0]["packets"] == 0
    rc, out, err = d.stop()
    assert rc == 0, err
    assert "Ports:" in out and "Tables:" in out and "Tenants:" in out, out


def test_tenants_are_isolated_and_keep_their_vni(lab, tmp_path):
    d = lab.start_dpu()
    lab.peer("rblue", "whoami", "7000", "blue")
    lab.peer("rred", "whoami", "7000", "red")
    ask = [sys.executable, "-c", "import socket;print(socket.create_connection(('10.0.0.21',7000),timeout=5).recv(9).decode())"]
    with Capture(lab.ns["vtep"], "eth0", str(tmp_path / "u.pcap"), "udp port 4789", "in") as cap:
        assert nsexec(lab.ns["vm1"], *ask).stdout.strip() == "blue"
        assert nsexec(lab.ns["vm3"], *ask).stdout.strip() == "red", "same address, the tenant's own host"
        wait_for(lambda: {("192.0.2.1", "192.0.2.2", 100), ("192.0.2.1", "192.0.2.3", 200)}
                 <= {(s, t, v) for s, t, v in filter(None, map(vxlan_of, cap.frames()))},
                 30, "both tenants' VXLAN frames in the capture")
    seen = {(s, t, v) for s, t, v in filter(None, map(vxlan_of, cap.frames()))}
    assert ("192.0.2.1", "192.0.2.2", 100) in seen and ("192.0.2.1", "192.0.2.3", 200) in seen, seen
    assert all((t, v) in (("192.0.2.2", 100), ("192.0.2.3", 200)) for _, t, v in seen), seen
    # red reaches neither blue's other subnet nor the internet (no nat: section)
    before = d.stats()["tenants"]["red"]["dropped"]
    assert not lab.ping("vm3", "10.0.1.12", count=2)
    assert not lab.ping("vm3", SERVER_IP, count=2)
    st = d.stats()
    assert st["tenants"]["red"]["dropped"] >= before + 4
    assert st["tenants"]["red"]["drops"].get("unroutable", 0) >= 4, st["tenants"]["red"]
    d.stop()


# ---- the internet gateway ----------------------------------------------------------------------

def test_snat_floating_and_forward_with_two_workers(lab):
    d = lab.start_dpu(workers=2)
    # out: the server sees the tenant's public address
    assert lab.transfer("inet", "vm1", SERVER_IP, 6001, 4 * MB) == "203.0.113.10"
    assert lab.transfer("inet", "vm2", SERVER_IP, 6002, 2 * MB) == "203.0.113.12", "vm2 leaves by its floating address"
    lab.peer("inet", "udp-echo", "6003", SERVER_IP)
    for sport in range(8):  # several flows: the two directions land on either worker
        assert lab.udp_ask("vm1", SERVER_IP, 6003, f"q{sport}").startswith("203.0.113.10:"), "UDP through SNAT"
    # in: the floating address and the forward reach vm2
    assert lab.transfer("vm2", "inet", "203.0.113.12", 6004, 2 * MB).startswith("198.51.100.")
    srv = lab.peer("vm2", "sink", "80")
    cli = lab.peer("inet", "source", "203.0.113.10", "8080", str(2 * MB))
    assert lab.finish(srv, cli).startswith("198.51.100."), "TCP 203.0.113.10:8080 is forwarded to vm2:80"
    st = d.stats()
    ct_by_worker = [w["ct_packets"] for w in st["workers"][1:]]
    assert all(n > 0 for n in ct_by_worker), f"conntrack on both workers: {ct_by_worker}"
    conns = d.ctl_cmd("ct", "dump").stdout
    assert "dst=198.51.100.1" in conns and "203.0.113.10" in conns, conns
    d.stop()


def test_drops_pcap_records_what_the_dataplane_dropped(lab, tmp_path):
    """`dpu run --drops-pcap FILE`: an unsolicited datagram from the internet to the public
    address is dropped, and the file (pcapng, as replay writes it) has it with its reason
    and port; the final report says how many were written."""
    if not shutil.which("tshark"):
        pytest.skip("tshark is not installed (apt-get install tshark)")
    drops = tmp_path / "drops.pcapng"
    d = lab.start_dpu(extra=("--drops-pcap", str(drops)))
    assert lab.udp_ask("inet", "203.0.113.10", 9999, "knock") == "timeout"
    assert lab.udp_ask("vm1", SERVER_IP, 9998, "out") == "timeout"  # goes out (nothing listens there)
    rc, out, err = d.stop()
    assert rc == 0, err
    m = re.search(r"^drops: (\d+) packets written to (.+)$", out, re.M)
    assert m and m.group(2) == str(drops), out
    r = subprocess.run(["tshark", "-r", str(drops), "-T", "fields", "-E", "separator=|", "-e", "frame.comment",
                        "-e", "ip.dst", "-e", "udp.dstport"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    rows = [line.split("|") for line in r.stdout.splitlines()]
    assert len(rows) == int(m.group(1)), rows
    assert ["drop_reason=nat_unsolicited in_port=inet", "203.0.113.10", "9999"] in rows, rows
    assert not [row for row in rows if row[2] == "9998"], "what was forwarded is not in the drops file"


# ---- changes while running -----------------------------------------------------------------------

def test_flows_and_reload_while_a_transfer_runs(lab, tmp_path):
    topo = lab.topology()
    d = lab.start_dpu(topo=topo)
    assert lab.ping("vm3", "10.0.0.21", count=1)
    srv, cli = lab.start_transfer("rblue", "vm1", "10.0.0.21", 5101, 12 * MB, 4 * MB)  # about 3 s
    # a flow added through the control socket takes effect at once
    d.ctl_cmd("add-flow", "table=0,priority=1000,in_port=vm3,actions=drop(policy)")
    assert not lab.ping("vm3", "10.0.0.21", count=2)
    assert "in_port=vm3 actions=drop(policy)" in d.ctl_cmd("dump-flows", "in_port=vm3").stdout
    # a bad file is refused whole, with the text `dpu flows` gives offline
    bad = tmp_path / "bad.flows"
    bad.write_text("table=0,priority=1001,in_port=vm1,actions=drop\ntable=0,priority=5,in_port=vm1,actions=output:nowhere\n")
    n_before = len(d.ctl_cmd("dump-flows").stdout.splitlines())
    live = d.ctl_cmd("add-flows", str(bad), check=False)
    offline = run_cli("flows", "--config", topo, str(bad), check=False)
    assert live.returncode == offline.returncode == 1
    assert live.stderr == offline.stderr and "bad.flows:2:" in live.stderr, (live.stderr, offline.stderr)
    assert len(d.ctl_cmd("dump-flows").stdout.splitlines()) == n_before, "nothing of the bad file applied"
    # reload a changed topology: vm1 gets a floating address; the user's flow stays
    t = yaml.safe_load(open(topo))
    t["tenants"]["blue"]["nat"]["floating"].append({"private": "10.0.0.11", "public": "203.0.113.11"})
    with open(topo, "w") as f:
        yaml.safe_dump(t, f)
    r = d.ctl_cmd("reload")
    assert r.stdout.startswith("reloaded:"), r.stdout
    assert lab.transfer("vm1", "inet", "203.0.113.11", 5102, 1 * MB).startswith("198.51.100."), "new floating address"
    assert "in_port=vm3 actions=drop(policy)" in d.ctl_cmd("dump-flows").stdout
    # a broken topology is refused whole with the offline error, the running one stays
    good = open(topo).read()
    with open(topo, "w") as f:
        f.write(good.replace("vni: 200", "vni: 100"))
    live = d.ctl_cmd("reload", check=False)
    offline = run_cli("compile", topo, check=False)
    assert live.returncode == offline.returncode == 1 and live.stderr == offline.stderr, (live.stderr, offline.stderr)
    with open(topo, "w") as f:
        f.write(good)
    assert lab.finish(srv, cli) == "10.0.0.11", "the transfer went on through every change"
    assert d.ctl_cmd("del-flows", "--strict", "table=0,priority=1000,in_port=vm3").stdout.strip() == "deleted 1 flows"
    assert lab.ping("vm3", "10.0.0.21", count=2)
    d.stop()


# ---- the control socket itself ---------------------------------------------------------------------

def test_control_socket_commands(lab):
    d = lab.start_dpu()
    mode = stat.S_IMODE(os.stat(d.ctl).st_mode)
    assert stat.S_ISSOCK(os.stat(d.ctl).st_mode) and mode == 0o600, oct(mode)
    assert lab.ping("vm1", SERVER_IP, count=2)
    show = json.loads(d.ctl_cmd("show", "--json").stdout)
    assert {p["name"]: p["interface"] for p in show["ports"]}["vm1"] == "vm1" and show["workers"] == 1
    ct = d.ctl_cmd("ct", "dump").stdout
    assert "icmp" in ct and "203.0.113.10" in ct, ct
    tr = d.ctl_cmd("trace", "--in-port", "vm1",
                   'Ether(src="02:00:00:00:01:11",dst="02:00:00:00:02:21")/IP(src="10.0.0.11",dst="10.0.0.21")/UDP()').stdout
    assert "tnl_push" in tr or "vxlan" in tr.lower(), tr
    assert d.ctl_cmd("ct", "flush").stdout.startswith("flushed ")
    assert d.ctl_cmd("ct", "dump").stdout.strip() == ""
    st = d.stats()
    assert st["ports"]["vm1"]["rx_packets"] >= 2 and st["interfaces"][0]["ifname"]
    text = d.ctl_cmd("stats").stdout
    assert "Workers:" in text and "Interfaces:" in text
    assert re.search(r"tenant\s+zone\s+connections\s+limit", text), "the conntrack table per tenant's zone"
    assert st["tenant_zones"] and all(len(row) == 3 for row in st["tenant_zones"])
    r = d.ctl_cmd("add-flow", "table=0,actions=output:nowhere", check=False)
    assert r.returncode == 1 and r.stderr.startswith("dpu: UnknownPortError:"), r.stderr
    d.stop()
    assert not os.path.exists(d.ctl), "the socket goes with the process"
    r = run_cli("stats", "--ctl", d.ctl, check=False)
    assert r.returncode == 1 and "no dpu is running at" in r.stderr, r.stderr


def test_second_instance_on_the_same_socket_is_refused(lab):
    d = lab.start_dpu()
    r = lab.run_dpu("--config", lab.topology(), "--port", "vm1=vm1", "--ctl", d.ctl)
    assert r.returncode == 1 and "another dpu is running there" in r.stderr, r.stderr
    d.stop()


# ---- metrics ---------------------------------------------------------------------------------------

def test_prometheus_metrics(lab):
    from prometheus_client.parser import text_string_to_metric_families

    d = lab.start_dpu(workers=2, extra=("--metrics", "127.0.0.1:19109"))
    assert lab.ping("vm1", "10.0.0.21", count=3)
    assert lab.ping("vm1", SERVER_IP, count=3)
    nsexec(lab.ns["vm1"], "ip", "addr", "add", "10.0.0.66/24", "dev", "eth0")
    try:  # a spoofed source: dropped, by reason
        nsexec(lab.ns["vm1"], "ping", "-c", "2", "-i", "0.2", "-W", "1", "-I", "10.0.0.66", "10.0.0.21", check=False)
    finally:
        nsexec(lab.ns["vm1"], "ip", "addr", "del", "10.0.0.66/24", "dev", "eth0")

    def scrape():
        samples = {}
        for fam in text_string_to_metric_families(d.metrics("http://127.0.0.1:19109/metrics")):
            for s in fam.samples:
                samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
        return samples

    def credited():  # a housekeeping round (50 ms) credits the tables
        samples = scrape()
        return samples if samples.get(("dpu_table_lookups_total", (("table", "0"),)), 0) >= 1 else None

    samples = wait_for(credited, 30, "a housekeeping round to credit table 0's lookups")
    get = lambda name, **lb: samples.get((name, tuple(sorted(lb.items()))))  # noqa: E731
    assert get("dpu_port_rx_packets_total", port="vm1") >= 8
    assert get("dpu_port_tx_packets_total", port="p0") >= 3
    assert get("dpu_tenant_rx_packets_total", tenant="blue") >= 6
    assert get("dpu_port_drops_total", port="vm1", reason="spoofed") >= 2
    assert get("dpu_drops_total", reason="spoofed") >= 2
    assert get("dpu_cache_misses_total") >= 1 and get("dpu_cache_hits_total", cache="emc") is not None
    assert get("dpu_conntrack_connections", zone="100") >= 1
    assert get("dpu_table_lookups_total", table="0") >= 1
    for w in ("1", "2"):
        assert 0.0 <= get("dpu_worker_busy_ratio", worker=w) <= 1.0
        assert get("dpu_worker_packets_per_batch", worker=w) is not None
    assert sum(get("dpu_worker_packets_total", worker=w) for w in ("1", "2")) >= 14
    assert get("dpu_interface_rx_ring_drops_total", port="vm1", interface="vm1") == 0
    d.stop()


# ---- ARP for next hops ---------------------------------------------------------------------------------

def test_next_hops_resolved_by_arp(lab):
    topo = lab.topology(uplink={"nexthop_mac": None, "nexthop": "192.0.2.2"},
                        internet={"nexthop_mac": None, "nexthop": "198.51.100.253"})  # nobody has .253 yet
    d = lab.start_dpu(topo=topo)
    wait_for(lambda: d.stats()["nexthops"]["uplink"]["state"] == "resolved", 30, "the uplink's next hop resolved")
    nh = d.stats()["nexthops"]
    assert nh["uplink"]["mac"] == VTEP_MAC and nh["uplink"]["state"] == "resolved", nh
    assert nh["internet"]["mac"] is None and nh["internet"]["state"] == "unresolved", nh
    assert lab.ping("vm1", "10.0.0.21"), "the underlay next hop was resolved"
    assert not lab.ping("vm1", SERVER_IP, count=2)
    assert d.stats()["ports"]["vm1"]["drops"].get("nexthop_unresolved", 0) >= 2
    ip(lab.ns["inet"], "addr", "add", "198.51.100.253/24", "dev", "eth0")
    try:
        wait_for(lambda: d.stats()["nexthops"]["internet"]["mac"] is not None, 30, "the internet next hop's MAC")
        assert d.stats()["nexthops"]["internet"]["mac"] == INET_ROUTER_MAC
        assert lab.ping("vm1", SERVER_IP), "resolved: the internet is reachable"
        assert "mod_dl_dst:" + INET_ROUTER_MAC in d.ctl_cmd("dump-flows", "table=42").stdout
    finally:
        ip(lab.ns["inet"], "addr", "del", "198.51.100.253/24", "dev", "eth0")
    d.stop()


# ---- interfaces that go away ------------------------------------------------------------------------------

def _cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def test_interface_down_and_up_while_running(lab):
    d = lab.start_dpu()
    assert lab.ping("rblue", "10.0.0.11")
    ip(lab.ns["dpu"], "link", "set", "vm1", "down")
    try:
        assert not lab.ping("rblue", "10.0.0.11", count=3)
        st = d.stats()
        assert st["ports"]["vm1"]["tx_dropped"] >= 3, "what could not be sent is counted"
        assert d.proc.poll() is None
    finally:
        ip(lab.ns["dpu"], "link", "set", "vm1", "up")
    wait_for(lambda: lab.ping("rblue", "10.0.0.11", count=1), 30, "a ping through vm1 once it is back")
    assert lab.ping("rblue", "10.0.0.11"), "traffic resumes once the interface is back"
    # With no traffic the worker sleeps in poll(): the error the socket reported
    # when the link went down was taken, not left to wake every poll at once.
    c0, t0 = _cpu_seconds(d.proc.pid), time.monotonic()
    time.sleep(2)  # not a wait for anything: the window over which dpu's idle CPU use is measured
    busy = (_cpu_seconds(d.proc.pid) - c0) / (time.monotonic() - t0)
    assert busy < 0.3, f"dpu used {busy:.0%} of a CPU while idle after the link came back"
    vm1 = [q for q in d.stats()["interfaces"] if q["ifname"] == "vm1"]
    assert vm1 and vm1[0]["link_errors"] >= 1, vm1
    d.stop()


def _gro(lab, dev: str) -> bool:
    out = nsexec(lab.ns["dpu"], "ethtool", "-k", dev).stdout
    return "generic-receive-offload: on" in out


def _pings_again(lab) -> bool:
    wait_for(lambda: lab.ping("rblue", "10.0.0.11", count=1), 30, "a ping through vm1 again")
    return lab.ping("rblue", "10.0.0.11")


@pytest.mark.parametrize("workers", [1, 2])
def test_interface_created_again_is_reattached(lab, workers):
    """A VM restarts: its tap (here its veth) is deleted and made again under the same
    name, with a new ifindex. dpu's sockets are bound to the old one; it opens them
    again on the new one and traffic goes on, both ways, without a restart."""
    d = lab.start_dpu(workers=workers)
    try:
        assert lab.ping("rblue", "10.0.0.11")
        sent = d.stats()["ports"]["vm1"]["tx_packets"]
        ip(lab.ns["dpu"], "link", "del", "vm1")
        dropped = d.stats()["ports"]["vm1"]["tx_dropped"]
        assert not lab.ping("rblue", "10.0.0.11", count=2)
        assert d.stats()["ports"]["vm1"]["tx_dropped"] >= dropped + 2, "what could not be sent is counted"
        lab.remake_vm("vm1", delete=False, setup=lambda ns, dev: nsexec(ns, "ethtool", "-K", dev, "gro", "on"))
        assert _pings_again(lab), "traffic reaches the VM on its new interface"
        assert lab.ping("vm1", "10.0.0.21"), "and leaves it"
        assert d.proc.poll() is None
        st = d.stats()
        assert st["ports"]["vm1"]["tx_packets"] >= sent + 3, "the port's counters go on"
        vm1 = [q for q in st["interfaces"] if q["ifname"] == "vm1"]
        assert vm1 and vm1[0]["link_errors"] >= 1, ("the interface's counters go on from the old sockets'", vm1)
        assert not _gro(lab, "vm1"), "GRO off on the new interface, as at start"
        if workers == 2:
            # Each worker opened its own socket of the new vm1 (one fanout group): 64 flows
            # from the VM reach both. A worker still on the old socket would see none.
            before = [w["packets"] for w in d.stats()["workers"][1:]]
            send = ("import socket\n"
                    "for p in range(40000, 40064):\n"
                    "    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
                    "    s.bind(('10.0.0.11', p)); s.sendto(b'x', ('10.0.0.21', 9)); s.close()\n")
            nsexec(lab.ns["vm1"], sys.executable, "-c", send)
            wait_for(lambda: all(w["packets"] > b for w, b in zip(d.stats()["workers"][1:], before)), 30,
                     "both workers to count packets of the 64 flows")
            after = [w["packets"] for w in d.stats()["workers"][1:]]
            assert all(a > b for a, b in zip(after, before)), (before, after)
            assert lab.transfer("vm1", "rblue", "10.0.0.11", 5201, 2 * MB) == "10.0.0.21"
            # An index whose first fanout group number is vm3's (ports vm1, vm2, vm3: vm3's group is
            # vm1's + 2; dpu numbers the new group vm1's + index * 40503): the kernel refuses that
            # group, and the workers meet in the next number of the sequence.
            lab.remake_vm("vm1", index=2 * pow(40503, -1, 1 << 16) % (1 << 16))
            assert _pings_again(lab), "reattached in the next fanout group"
            assert lab.ping("rred", "10.0.0.11"), "and vm3, whose group that first number is, still works"
        # Moved to another namespace and back: the same index, but the sockets lost their binding.
        index = ip(lab.ns["dpu"], "-j", "link", "show", "vm1").stdout
        ip(lab.ns["dpu"], "link", "set", "vm1", "netns", lab.ns["inet"])
        ip(lab.ns["inet"], "link", "set", "vm1", "netns", lab.ns["dpu"])
        ip(lab.ns["dpu"], "link", "set", "vm1", "up")
        assert json.loads(ip(lab.ns["dpu"], "-j", "link", "show", "vm1").stdout)[0]["ifindex"] == \
            json.loads(index)[0]["ifindex"]
        assert _pings_again(lab), "traffic reaches the VM after its interface came back with the same index"
    finally:
        rc, _, err = d.stop()
    assert rc == 0
    assert err.count("interface vm1 was created again: reattached") == 2 + (workers == 2), err
    assert "warning" not in err, err
    assert _gro(lab, "vm1"), "GRO back on at exit, as dpu found it"
    nsexec(lab.ns["dpu"], "ethtool", "-K", "vm1", "gro", "off")  # as the lab made it


# ---- jumbo frames ------------------------------------------------------------------------------------------

def test_jumbo_frames_over_a_jumbo_underlay(tmp_path):
    lab = Lab(str(tmp_path), underlay_mtu=9266)  # VMs get 9216
    try:
        d = lab.start_dpu()
        assert lab.ping("vm1", "10.0.0.21", size=9216 - 28, df=True), "a 9,216-byte IP packet, both ways"
        assert lab.transfer("rblue", "vm1", "10.0.0.21", 5201, 8 * MB) == "10.0.0.11"
        assert lab.transfer("vm1", "rblue", "10.0.0.11", 5202, 8 * MB) == "10.0.0.21"
        st = d.stats()
        assert st["ports"]["p0"]["drops"] == {} and st["ports"]["vm1"]["drops"].get("oversize", 0) == 0
        d.stop()
    finally:
        lab.close()


# ---- starting and stopping --------------------------------------------------------------------------------------

def gro(lab, dev: str) -> str:
    out = nsexec(lab.ns["dpu"], "ethtool", "-k", dev).stdout
    return re.search(r"^generic-receive-offload: (\w+)", out, re.M).group(1)


def test_sigterm_under_load_exits_cleanly(tmp_path):
    lab = Lab(str(tmp_path))
    try:
        nsexec(lab.ns["dpu"], "ethtool", "-K", "p0", "gro", "on")
        before = {dev: gro(lab, dev) for dev in ("p0", "vm1")}
        assert before["p0"] == "on"
        d = lab.start_dpu(workers=2)
        assert gro(lab, "p0") == "off"  # frames as they were on the wire
        srv, cli = lab.start_transfer("rblue", "vm1", "10.0.0.21", 5301, 40 * MB, 20 * MB)
        wait_for(lambda: d.stats()["ports"]["vm1"]["rx_packets"] > 100, 60, "the transfer under way through vm1")
        rc, out, err = d.stop(signal.SIGTERM)
        assert {dev: gro(lab, dev) for dev in before} == before  # what dpu turned off is back on
        assert rc == 0, err
        assert "Traceback" not in err
        m = re.search(r"^vm1\s+(\d+)\s+(\d+)", out, re.M)
        assert m and int(m.group(1)) > 100, out
        assert "Interfaces:" in out and "Ran " in out
        assert not os.path.exists(d.ctl)
        cli.kill()
        srv.kill()
    finally:
        lab.close()
    assert lab.leftovers() == []
    assert not [line for line in sh("ip", "-o", "link").stdout.splitlines() if lab.tag in line]


def test_sigterm_as_soon_as_it_says_it_forwards(lab):
    """The signal handlers are in place before dpu announces itself: a SIGTERM
    sent the moment the line appears still ends in exit 0 and the counters."""
    d = lab.start_dpu()
    rc, out, err = d.stop(signal.SIGTERM)
    assert rc == 0, err
    assert "Interfaces:" in out and "Traceback" not in err
    assert not os.path.exists(d.ctl)


def test_errors_before_start_are_one_line(lab, tmp_path):
    topo = lab.topology()
    bad = tmp_path / "bad.yaml"
    bad.write_text(open(topo).read().replace("vni: 200", "vni: 100"))
    ctl = str(tmp_path / "x.ctl")
    flows = tmp_path / "extra.txt"
    flows.write_text("# extra\nip,nw_dsst=10.0.0.1,actions=drop\n")
    cases = {
        "bad flows file": (["--config", topo, "--port", "vm1=vm1", "--flows", str(flows)],
                           f"{flows}:2: column 4 ('nw_dsst')"),
        "missing interface": (["--config", topo, "--port", "vm1=nosuch0"], "no interface named nosuch0"),
        "port twice": (["--config", topo, "--port", "vm1=vm1", "--port", "vm1=vm2"], "port vm1 is given twice"),
        "interface twice": (["--config", topo, "--port", "vm1=vm1", "--port", "vm2=vm1"], "interface vm1 is given twice"),
        "unknown port": (["--config", topo, "--port", "vm9=vm1"], "the topology has no port vm9"),
        "bad config": (["--config", str(bad), "--port", "vm1=vm1"], "TopologyError"),
        "no port": (["--config", topo], "the following arguments are required: --port"),
        "drops file": (["--config", topo, "--port", "vm1=vm1", "--drops-pcap", str(tmp_path / "no" / "d.pcapng")],
                       f"{tmp_path / 'no' / 'd.pcapng'}: cannot write the drops file: No such file or directory"),
    }
    for what, (args, text) in cases.items():
        r = lab.run_dpu(*args, "--ctl", ctl)
        lines = r.stderr.strip().splitlines()
        if what == "no port":  # argparse's own: usage, then the one line
            lines = lines[-1:]
        assert r.returncode != 0 and len(lines) == 1, (what, r.stderr)
        assert text in r.stderr and "Traceback" not in r.stderr, (what, r.stderr)
        assert not os.path.exists(ctl), what
    # Outputs that would destroy an input or a file: refused, the file intact.
    kept = tmp_path / "topo.yaml"
    kept.write_text(open(topo).read())
    regular = tmp_path / "regular.ctl"
    regular.write_text("keep me\n")
    long_ctl = str(tmp_path / ("x" * 120 + ".ctl"))
    cases = {
        "drops file is the topology": (["--drops-pcap", str(kept), "--ctl", ctl],
                                       f"{kept}: writing the drops file would destroy the topology file {kept}"),
        "ctl is a regular file": (["--ctl", str(regular)], f"--ctl {regular}: is a file that is not a socket"),
        "ctl is the topology": (["--ctl", str(kept)], f"--ctl {kept}: is a file that is not a socket"),
        "ctl too long": (["--ctl", long_ctl], f"--ctl {long_ctl}: too long for a unix socket"),
    }
    for what, (args, text) in cases.items():
        r = lab.run_dpu("--config", str(kept), "--port", "vm1=vm1", *args)
        assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, (what, r.stderr)
        assert text in r.stderr and "Traceback" not in r.stderr, (what, r.stderr)
        assert kept.read_text() == open(topo).read() and regular.read_text() == "keep me\n", what
        assert not os.path.exists(ctl) and not os.path.exists(long_ctl), what
    ip(lab.ns["dpu"], "link", "set", "vm2", "down")
    try:
        r = lab.run_dpu("--config", topo, "--port", "vm2=vm2", "--ctl", ctl)
        assert r.returncode == 1 and r.stderr.strip() == "dpu: LiveError: port vm2: interface vm2 is down (ip link set vm2 up)"
    finally:
        ip(lab.ns["dpu"], "link", "set", "vm2", "up")
    if shutil.which("setpriv"):
        # root without CAP_NET_RAW (out of the bounding set: gone after exec)
        r = subprocess.run(["ip", "netns", "exec", lab.ns["dpu"], "setpriv", "--bounding-set=-net_raw", sys.executable,
                            "-m", "dpu.cli", "run", "--config", topo, "--port", "vm1=vm1", "--ctl", ctl],
                           capture_output=True, text=True, cwd=ROOT, timeout=30)
        assert r.returncode == 1 and r.stderr.strip() == "dpu: LiveError: dpu run needs root or CAP_NET_RAW to open its interfaces", r.stderr
