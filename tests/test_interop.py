"""Interop with Linux's own vxlan driver: real kernel, real packets, both directions.

A namespace plays the remote VTEP of tenant blue (192.0.2.2 or 2001:db8::2) with a kernel
vxlan device for VNI 100 that owns blue's remote endpoint (02:00:00:00:02:21, 10.0.0.21).
dpu is not attached to interfaces: the test carries frames between `dp.process`/`dp.replay`
and the wire (see tests/netns.py for the layout and why tx checksum offload is off there).
"""
import os
import shutil
import socket

import pytest
import yaml
from scapy.all import ICMP, IP, UDP, Ether, Raw
from scapy.layers.vxlan import VXLAN

from dpu import Dataplane
from netns import KernelVtep, read_pcap, tshark as run_tshark, write_pcap
from helpers.packets import (
    BLUE_REMOTE_IP, BLUE_REMOTE_MAC, BLUE_VNI, BROADCAST, NEXTHOP_MAC, RED_REMOTE_IP, RED_REMOTE_MAC, RED_VNI,
    UPLINK_MAC, VM1_IP, VM1_MAC, VM3_IP, VM3_MAC, VTEP_BLUE, VTEP_LOCAL, arp_request,
)

pytestmark = pytest.mark.netns

TOPO = os.path.join(os.path.dirname(__file__), "..", "examples", "topology.yaml")
ZERO_MAC = "00:00:00:00:00:00"
V6_LOCAL, V6_BLUE, V6_RED = "2001:db8::1", "2001:db8::2", "2001:db8::3"

# Underlay variants: (dpu's VTEP, kernel VTEP, vxlan udpcsum)
UNDERLAYS = {
    "v4": (VTEP_LOCAL, VTEP_BLUE, False),
    "v4-udpcsum": (VTEP_LOCAL, VTEP_BLUE, True),
    "v6": (V6_LOCAL, V6_BLUE, None),      # IPv6 always carries a UDP checksum
}

PING_ID, PING_SEQ, PING_DATA = 0x1D9, 7, b"dpu-interop-ping"
TO_KERNEL = (4000, 5678, b"dpu->kernel")    # vm1 sport, kernel listener port, payload
TO_VM1 = (5679, 4000, b"kernel->dpu")       # kernel sport, vm1 port, payload


def topology(underlay: str) -> dict:
    with open(TOPO) as f:
        t = yaml.safe_load(f)
    if underlay == "v6":   # as v6_topo() in test_overlay.py
        t["uplink"]["ip"] = V6_LOCAL
        t["tenants"]["blue"]["remote"][0]["vtep"] = V6_BLUE
        t["tenants"]["blue"]["flood"] = [V6_BLUE]
        t["tenants"]["red"]["remote"][0]["vtep"] = V6_RED
        t["tenants"]["red"]["flood"] = [V6_RED]
    return t


def outer_len(underlay: str) -> int:
    return 14 + (40 if underlay == "v6" else 20) + 8 + 8


@pytest.fixture
def make_vtep(netns_ok):
    """Factory for kernel VTEPs; every one is torn down when the test ends, pass or fail."""
    if not shutil.which("tcpdump"):
        pytest.skip("tcpdump is not installed (apt-get install tcpdump)")
    made = []

    def make(underlay: str) -> KernelVtep:
        ours, theirs, udpcsum = UNDERLAYS[underlay]
        v = KernelVtep(
            vni=BLUE_VNI, local=theirs, peer=ours, local_mac=NEXTHOP_MAC, peer_mac=UPLINK_MAC,
            overlay_mac=BLUE_REMOTE_MAC, overlay_ip=BLUE_REMOTE_IP, overlay_prefix=24,
            # the kernel's own ARP would be flooded to us and never answered: pin vm1
            neighbours={VM1_IP: VM1_MAC}, fdb=[VM1_MAC, ZERO_MAC], udpcsum=bool(udpcsum),
        )
        made.append(v)
        return v

    yield make
    for v in made:
        v.close()


def ping_request():
    return Ether(src=VM1_MAC, dst=BLUE_REMOTE_MAC) / IP(src=VM1_IP, dst=BLUE_REMOTE_IP) / ICMP(type=8, id=PING_ID, seq=PING_SEQ) / Raw(PING_DATA)


def datagram_to_kernel():
    sport, dport, data = TO_KERNEL
    return Ether(src=VM1_MAC, dst=BLUE_REMOTE_MAC) / IP(src=VM1_IP, dst=BLUE_REMOTE_IP) / UDP(sport=sport, dport=dport) / Raw(data)


def encap(dp, frame, port="vm1"):
    outs = dp.process(bytes(frame), in_port=port)
    assert [o.port for o in outs] == ["p0"], [(o.port, Ether(o.data).summary()) for o in outs]
    return outs[0].data


class Exchange:
    """What one round trip left behind: frames and capture files."""


def exchange(vtep: KernelVtep, underlay: str, tmp_path) -> Exchange:
    """vm1 pings 10.0.0.21 and sends it a datagram through dpu into the kernel VTEP; the
    kernel answers the ping and sends vm1 a datagram. Everything is captured."""
    x = Exchange()
    x.underlay, x.dir = underlay, tmp_path
    dp = Dataplane.from_topology(topology(underlay))
    x.inner = [bytes(ping_request()), bytes(datagram_to_kernel())]
    x.p0 = [encap(dp, f) for f in x.inner]
    x.uplink_pcap, x.overlay_pcap, x.wire_pcap = (str(tmp_path / n) for n in ("uplink.pcap", "overlay.pcap", "wire.pcap"))
    listener = vtep.udp_socket((BLUE_REMOTE_IP, TO_KERNEL[1]))
    talker = vtep.udp_socket((BLUE_REMOTE_IP, TO_VM1[0]))
    listener.settimeout(3)
    try:
        with vtep.capture_uplink(x.uplink_pcap, "udp port 4789") as up, \
                vtep.capture_overlay(x.overlay_pcap) as ov, vtep.capture_wire(x.wire_pcap) as wire:
            vtep.send(*x.p0)
            x.overlay = ov.wait(2)
            try:
                x.received = listener.recvfrom(2048)
            except socket.timeout:
                x.received = None
            wire.wait(1)   # the echo reply first, then the kernel's own datagram
            talker.sendto(TO_VM1[2], (VM1_IP, TO_VM1[1]))
            x.wire = wire.wait(2)
            x.uplink = up.wait(2)
    finally:
        listener.close()
        talker.close()
    x.overlay, x.wire, x.uplink = read_pcap(x.overlay_pcap), read_pcap(x.wire_pcap), read_pcap(x.uplink_pcap)
    return x


def kernel_inner(x: Exchange):
    """The inner frames of the kernel's VXLAN packets, as the kernel built them."""
    return [f[outer_len(x.underlay):] for f in x.wire]


def replay_wire(x: Exchange):
    dp = Dataplane.from_topology(topology(x.underlay))
    out = x.dir / "replayed"
    summary = dp.replay({"p0": x.wire_pcap}, str(out))
    return dp, summary, out


def nonempty_outputs(out) -> dict:
    return {name[:-5]: read_pcap(str(out / name)) for name in sorted(os.listdir(out))
            if name.endswith(".pcap") and read_pcap(str(out / name))}


# ---- 1. dpu encapsulates, the kernel decapsulates ------------------------------------------------

@pytest.mark.parametrize("underlay", list(UNDERLAYS))
def test_kernel_accepts_what_dpu_encapsulates(make_vtep, underlay, tmp_path):
    vtep = make_vtep(underlay)
    x = exchange(vtep, underlay, tmp_path)
    # the wire carried exactly dpu's frames to the kernel
    assert x.uplink == x.p0
    # the vxlan device handed the kernel's stack vm1's frames byte for byte
    assert x.overlay == x.inner, [Ether(f).summary() for f in x.overlay]
    # ... and the stack took them: a datagram on the socket, an echo reply on the wire
    assert x.received == (TO_KERNEL[2], (VM1_IP, TO_KERNEL[0])), "datagram not received by the kernel's socket"
    replies = [Ether(f) for f in kernel_inner(x) if ICMP in Ether(f)]
    assert len(replies) == 1, "the kernel did not answer the echo request"
    r = replies[0]
    assert (r[IP].src, r[IP].dst, r[ICMP].type, r[ICMP].id, r[ICMP].seq, r[Raw].load) == (
        BLUE_REMOTE_IP, VM1_IP, 0, PING_ID, PING_SEQ, PING_DATA)
    assert vtep.counters(vtep.vx)["rx"]["packets"] == 2 and vtep.counters(vtep.vx)["rx"]["errors"] == 0


@pytest.mark.parametrize("underlay", ["v4-udpcsum", "v6"])
def test_kernel_checks_the_outer_udp_checksum(make_vtep, underlay, tmp_path):
    """Control for the above: the kernel does verify outer UDP checksums, so its accepting
    dpu's frames means dpu's checksums are right (IPv6: mandatory, RFC 8200 8.1)."""
    vtep = make_vtep(underlay)
    dp = Dataplane.from_topology(topology(underlay))
    good = encap(dp, ping_request())
    if underlay == "v4-udpcsum":   # dpu sends 0 over IPv4: give the frame a real checksum first
        p = Ether(good)
        p[UDP].chksum = None
        good = bytes(Ether(bytes(p)))
        assert Ether(good)[UDP].chksum != 0
    bad = bytearray(good)
    bad[-1] ^= 0xFF   # a payload byte flipped in transit
    with vtep.capture_overlay(tmp_path / "overlay.pcap") as ov:
        vtep.send(bytes(bad), good)
        ov.wait(1)                   # the good one; the bad one was handled before it
        got = ov.wait(2, timeout=0.3)
    assert got == [good[outer_len(underlay):]], "the corrupted copy must be dropped, the good one delivered"


def test_kernel_rejects_vxlan_gpe_flags(make_vtep, tmp_path):
    """Control: Linux drops a VXLAN header with flags other than 0x08 (scapy's default
    VXLAN() is GPE, 0x0c), so its accepting dpu's frames checks dpu's flags byte too."""
    vtep = make_vtep("v4")
    dp = Dataplane.from_topology(topology("v4"))
    good = encap(dp, ping_request())
    assert good[outer_len("v4") - 8] == 0x08
    gpe = bytearray(good)
    gpe[outer_len("v4") - 8] = 0x0C
    with vtep.capture_overlay(tmp_path / "overlay.pcap") as ov:
        vtep.send(bytes(gpe), good)
        ov.wait(1)
        got = ov.wait(2, timeout=0.3)
    assert got == [bytes(ping_request())]


# ---- 2. the kernel encapsulates, dpu decapsulates --------------------------------------------------

@pytest.mark.parametrize("underlay", list(UNDERLAYS))
def test_dpu_decapsulates_what_the_kernel_sends(make_vtep, underlay, tmp_path):
    vtep = make_vtep(underlay)
    x = exchange(vtep, underlay, tmp_path)
    assert len(x.wire) == 2, [Ether(f).summary() for f in x.wire]
    for f in x.wire:
        o = Ether(f)
        assert o[VXLAN].flags == 0x08 and o[VXLAN].vni == BLUE_VNI and o[UDP].dport == 4789
        if underlay == "v4":
            assert o[UDP].chksum == 0, "noudpcsum: the kernel sends no outer checksum"
        else:
            assert o[UDP].chksum != 0, "udpcsum / IPv6: the kernel checksums the outer UDP"
    dp, summary, out = replay_wire(x)
    outputs = nonempty_outputs(out)
    assert list(outputs) == ["vm1"], f"only vm1 may receive: {list(outputs)}; drops {summary.drops}"
    assert outputs["vm1"] == kernel_inner(x), "vm1 gets the inner frames exactly as the kernel built them"
    assert summary.drops == {} and (summary.packets_in, summary.packets_out) == (2, 2)
    reply, dgram = (Ether(f) for f in outputs["vm1"])
    assert (reply.src, reply.dst, reply[IP].src, reply[IP].dst) == (BLUE_REMOTE_MAC, VM1_MAC, BLUE_REMOTE_IP, VM1_IP)
    assert (reply[ICMP].type, reply[ICMP].id, reply[ICMP].seq, reply[Raw].load) == (0, PING_ID, PING_SEQ, PING_DATA)
    assert (dgram.src, dgram.dst, dgram[IP].src, dgram[IP].dst) == (BLUE_REMOTE_MAC, VM1_MAC, BLUE_REMOTE_IP, VM1_IP)
    assert (dgram[UDP].sport, dgram[UDP].dport, dgram[Raw].load) == TO_VM1
    t = dp.stats()["tenants"]
    assert t["blue"]["tx_packets"] == 2 and t["red"]["tx_packets"] == 0 and t["red"]["rx_packets"] == 0


# ---- 3. checksums: the kernel's udpcsum accepted, corruption dropped ------------------------------

@pytest.mark.parametrize("underlay", ["v4-udpcsum", "v6"])
def test_dpu_drops_kernel_frames_corrupted_in_transit(make_vtep, underlay, tmp_path):
    vtep = make_vtep(underlay)
    x = exchange(vtep, underlay, tmp_path)
    assert len(x.wire) == 2
    reply, dgram = x.wire
    flipped = bytearray(dgram)
    flipped[-1] ^= 0x01                   # a payload bit flipped on the way
    wrong_sum = bytearray(reply)
    off = outer_len(underlay) - 16 + 6    # the outer UDP checksum field
    wrong_sum[off:off + 2] = bytes([wrong_sum[off] ^ 0x5A, wrong_sum[off + 1]])
    src = write_pcap(str(tmp_path / "corrupted.pcap"), [bytes(flipped), reply, bytes(wrong_sum), dgram])
    dp = Dataplane.from_topology(topology(underlay))
    out = tmp_path / "replayed"
    summary = dp.replay({"p0": src}, str(out))
    assert nonempty_outputs(out) == {"vm1": kernel_inner(x)}, "the intact frames still arrive, in order"
    assert dp.stats()["ports"]["p0"]["drops"] == {"vxlan_bad_checksum": 2}
    assert summary.drops == {"vxlan_bad_checksum": 2}


# ---- 4. tenant isolation against the kernel ----------------------------------------------------

def test_red_traffic_never_reaches_the_blue_vni(make_vtep, tmp_path):
    vtep = make_vtep("v4")
    dp = Dataplane.from_topology(topology("v4"))
    red_ping = Ether(src=VM3_MAC, dst=RED_REMOTE_MAC) / IP(src=VM3_IP, dst=RED_REMOTE_IP) / ICMP(type=8, id=3, seq=1) / Raw(b"red")
    red_bcast = arp_request(VM3_MAC, VM3_IP, "10.0.0.99")     # unknown target: flooded in red
    red = [encap(dp, red_ping, "vm3"), encap(dp, red_bcast, "vm3")]
    for f in red:
        assert Ether(f)[VXLAN].vni == RED_VNI
    # as dpu emits them (to red's VTEP 192.0.2.3), and misdelivered to the blue VTEP's address
    readdressed = []
    for f in red:
        p = Ether(f)
        p[IP].dst = VTEP_BLUE
        p[IP].chksum = None
        readdressed.append(bytes(Ether(bytes(p))))
    before = vtep.counters(vtep.vx)["rx"]["packets"]
    with vtep.capture_overlay(tmp_path / "overlay.pcap") as ov, \
            vtep.capture_uplink(tmp_path / "uplink.pcap", "udp port 4789") as up, \
            vtep.capture_wire(tmp_path / "wire.pcap", bpf="") as wire:
        vtep.send(*red, *readdressed)
        arrived = up.wait(4)
        leaked = ov.wait(1, timeout=0.5)
        # positive control: the same path is live, a blue frame gets through right after
        blue = encap(dp, ping_request())
        vtep.send(blue)
        got = ov.wait(1, timeout=3)
        back = wire.wait(1, timeout=3)
    assert arrived[:4] == red + readdressed, "red's frames reached the blue VTEP's uplink"
    assert leaked == [], [Ether(f).summary() for f in leaked]
    assert got == [bytes(ping_request())], "control: blue traffic must still arrive"
    assert len(back) == 1 and Ether(back[0])[VXLAN].vni == BLUE_VNI, "only blue's echo reply comes back"
    assert vtep.counters(vtep.vx)["rx"]["packets"] == before + 1


# ---- 6. tshark decodes everything, with valid checksums ----------------------------------------------

BAD = ('_ws.malformed || _ws.expert.severity == "Error" || ip.checksum.status == "Bad" '
       '|| udp.checksum.status == "Bad" || icmp.checksum.status == "Bad"')


@pytest.mark.tshark
@pytest.mark.parametrize("underlay", list(UNDERLAYS))
def test_tshark_finds_no_malformed_or_bad_checksum(make_vtep, tshark, underlay, tmp_path):
    vtep = make_vtep(underlay)
    x = exchange(vtep, underlay, tmp_path)
    _, _, out = replay_wire(x)
    dpu_emitted = write_pcap(str(tmp_path / "dpu_p0.pcap"), x.p0)
    files = {
        "dpu's frames as the kernel received them": x.uplink_pcap,
        "dpu's frames as emitted": dpu_emitted,
        "the kernel's frames on the wire": x.wire_pcap,
        "what the kernel decapsulated": x.overlay_pcap,
        "what dpu decapsulated for vm1": str(out / "vm1.pcap"),
    }
    for what, path in files.items():
        assert run_tshark(path, "-Y", BAD) == [], f"tshark flags {what} ({path})"
    # the filter is not vacuous: a flipped payload bit and a cut-short frame are flagged
    flipped = bytearray(x.wire[1])
    flipped[-1] ^= 1
    worse = write_pcap(str(tmp_path / "worse.pcap"), [bytes(flipped), x.p0[0][:outer_len(underlay) + 20]])
    assert len(run_tshark(worse, "-Y", BAD)) == 2
    # dpu sends a zero outer UDP checksum over IPv4, a real one over IPv6; the kernel's
    # follows its udpcsum flag. udp.checksum.status: 1 Good, 3 Not present (zero).
    expect = {"dpu": "1" if underlay == "v6" else "3", "kernel": "3" if underlay == "v4" else "1"}
    for what, path in (("dpu", x.uplink_pcap), ("kernel", x.wire_pcap)):
        rows = run_tshark(path, "-Y", "vxlan", "-T", "fields", "-E", "occurrence=f",
                      "-e", "vxlan.vni", "-e", "udp.checksum.status")
        assert [r.split("\t") for r in rows] == [[str(BLUE_VNI), expect[what]]] * 2, f"{what}: {rows}"
    # the inner ICMP and UDP were really checked (and found good), outer layers too
    inner_good = '(icmp.checksum.status == "Good" && ip.checksum.status == "Good") || udp.checksum.status#%d == "Good"'
    for path, layer in ((x.uplink_pcap, 2), (x.wire_pcap, 2), (x.overlay_pcap, 1), (str(out / "vm1.pcap"), 1)):
        good = run_tshark(path, "-Y", inner_good % layer)
        assert len(good) == 2, (path, good)


# ---- flooding (the all-zero fdb entry) and the largest frame -----------------------------------

def test_broadcast_both_ways(make_vtep, tmp_path):
    """BUM: dpu's head-end replication reaches the kernel's VNI; the kernel's flood (its
    ARP for an unknown neighbour, sent via the all-zero fdb entry) reaches blue's local
    ports through dpu, and not red's."""
    vtep = make_vtep("v4")
    dp = Dataplane.from_topology(topology("v4"))
    garp = arp_request(VM1_MAC, VM1_IP, VM1_IP)          # gratuitous ARP: flooded, not answered
    outs = dp.process(bytes(garp), in_port="vm1")
    assert sorted(o.port for o in outs) == ["p0", "vm2"]
    flooded = [o.data for o in outs if o.port == "p0"][0]
    talker = vtep.udp_socket()
    try:
        with vtep.capture_overlay(tmp_path / "overlay.pcap") as ov, vtep.capture_wire(tmp_path / "wire.pcap") as wire:
            vtep.send(flooded)
            got = ov.wait(1)
            talker.sendto(b"?", ("10.0.0.50", 9))            # unknown: the kernel ARPs for it
            kernel_bum = wire.wait(1)[:1]
    finally:
        talker.close()
    assert got == [bytes(garp)]
    assert len(kernel_bum) == 1
    inner = Ether(kernel_bum[0][outer_len("v4"):])
    assert inner.dst == BROADCAST and inner.src == BLUE_REMOTE_MAC and inner.pdst == "10.0.0.50"
    src = write_pcap(str(tmp_path / "bum.pcap"), kernel_bum)
    out = tmp_path / "replayed"
    dp2 = Dataplane.from_topology(topology("v4"))
    dp2.replay({"p0": src}, str(out))
    assert nonempty_outputs(out) == {"vm1": [bytes(inner)], "vm2": [bytes(inner)]}


@pytest.mark.parametrize("underlay", ["v4", "v6"])
def test_largest_frames_both_ways(make_vtep, underlay, tmp_path):
    """The biggest inner packet for a 1500-byte underlay (1450 bytes of inner IP over
    IPv4, 1430 over IPv6): dpu's arrives whole in the kernel's socket, and the kernel's
    (its vxlan device sized for that underlay) arrives whole at vm1 through dpu."""
    vtep = make_vtep(underlay)
    dp = Dataplane.from_topology(topology(underlay))
    ip_len = 1500 - outer_len(underlay)   # outer IP+UDP+VXLAN and the inner Ethernet header
    (sport, dport, _), (ksport, kdport, _) = TO_KERNEL, TO_VM1
    payload = (bytes(range(256)) * 6)[:ip_len - 28]
    frame = Ether(src=VM1_MAC, dst=BLUE_REMOTE_MAC) / IP(src=VM1_IP, dst=BLUE_REMOTE_IP, flags="DF") / UDP(sport=sport, dport=dport) / Raw(payload)
    assert len(frame[IP]) == ip_len
    sent = encap(dp, frame)
    assert len(sent) == 14 + 1500
    listener = vtep.udp_socket((BLUE_REMOTE_IP, dport))
    talker = vtep.udp_socket((BLUE_REMOTE_IP, ksport))
    listener.settimeout(3)
    try:
        with vtep.capture_wire(tmp_path / "wire.pcap") as wire:
            vtep.send(sent)
            assert listener.recvfrom(4096) == (payload, (VM1_IP, sport))
            talker.sendto(payload[::-1], (VM1_IP, kdport))
            back = wire.wait(1)
    finally:
        listener.close()
        talker.close()
    assert [len(f) for f in back] == [14 + 1500], "one unfragmented VXLAN packet from the kernel"
    out = tmp_path / "replayed"
    Dataplane.from_topology(topology(underlay)).replay({"p0": str(tmp_path / "wire.pcap")}, str(out))
    got = nonempty_outputs(out)
    assert got == {"vm1": [back[0][outer_len(underlay):]]}
    assert Ether(got["vm1"][0])[Raw].load == payload[::-1]
