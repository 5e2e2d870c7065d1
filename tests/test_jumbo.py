"""Jumbo frames (issue: live mode): frames up to 9,216 bytes and beyond are forwarded,
encapsulated and decapsulated, in process() and in replay; only frames longer than a big
buffer (10,112 bytes) are "oversize"."""
import copy
import os

import pytest
import yaml
from scapy.all import ICMP, IP, UDP, Ether, Raw, rdpcap, wrpcap
from scapy.layers.vxlan import VXLAN

from dpu import Dataplane
from helpers.packets import BLUE_REMOTE_IP, BLUE_REMOTE_MAC, BLUE_VNI, VM1_IP, VM1_MAC, VTEP_BLUE, udp, vxlan

TOPO = os.path.join(os.path.dirname(__file__), "..", "examples", "topology.yaml")
PORTS = ["p1", "p2"]
MAX_FRAME = 10240 - 128


def jumbo(size, i=0):
    """A UDP frame of exactly `size` bytes (Ethernet header included)."""
    f = Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02") / IP(src="10.0.0.1", dst="10.0.0.2") / UDP(
        sport=1000 + i, dport=2000)
    return f / Raw(bytes([i & 0xFF]) * (size - len(f)))


def topo(mtu):
    with open(TOPO) as f:
        t = yaml.safe_load(f)
    t = copy.deepcopy(t)
    t["uplink"]["mtu"] = mtu
    return t


@pytest.mark.parametrize("size", [1921, 4000, 9000, 9216, MAX_FRAME])
def test_jumbo_frames_forward_unchanged(size):
    dp = Dataplane(ports=PORTS, flows=["in_port=p1,actions=output:p2"])
    f = bytes(jumbo(size))
    outs = dp.process(f, in_port="p1")
    assert [(o.port, o.data) for o in outs] == [("p2", f)]
    st = dp.stats()["ports"]
    assert st["p1"]["rx_bytes"] == size and st["p2"]["tx_bytes"] == size and st["p1"]["drops"] == {}


def test_one_byte_past_a_big_buffer_is_oversize():
    dp = Dataplane(ports=PORTS, flows=["in_port=p1,actions=output:p2"])
    assert dp.process(bytes(jumbo(MAX_FRAME + 1)), in_port="p1") == []
    assert dp.stats()["ports"]["p1"]["drops"] == {"oversize": 1}


def test_more_jumbo_frames_than_big_buffers_keep_their_order():
    """The worker's pool has fewer big buffers than this call brings: the batch is cut
    where they run out, and every frame still goes out, in order."""
    dp = Dataplane(ports=PORTS, flows=["in_port=p1,actions=output:p2"])
    frames = []
    for i in range(1500):
        frames.append(bytes(jumbo(9216 if i % 3 else 64, i)))
    outs = dp.process(frames, in_port="p1")
    assert [o.data for o in outs] == frames
    assert dp.stats()["ports"]["p2"]["tx_packets"] == 1500


def test_jumbo_frames_replay_to_identical_pcaps(tmp_path):
    dp = Dataplane(ports=PORTS, flows=["in_port=p1,actions=output:p2"])
    frames = [jumbo(s, i) for i, s in enumerate([64, 9216, 1500, 9000, 9216, 60, MAX_FRAME])]
    wrpcap(str(tmp_path / "in.pcap"), frames)
    s = dp.replay({"p1": str(tmp_path / "in.pcap")}, tmp_path / "out")
    assert s.packets_in == 7 and s.packets_out == 7 and s.drops == {}
    got = rdpcap(str(tmp_path / "out" / "p2.pcap"))
    assert [bytes(p) for p in got] == [bytes(f) for f in frames]


def test_jumbo_inner_frame_encapsulated_over_a_jumbo_underlay():
    dp = Dataplane.from_topology(topo(9300))
    inner = udp(VM1_MAC, BLUE_REMOTE_MAC, VM1_IP, BLUE_REMOTE_IP, payload=b"J" * (9216 - 42))
    assert len(bytes(inner)) == 9216
    outs = dp.process(inner, in_port="vm1")
    assert [o.port for o in outs] == ["p0"]
    o = Ether(outs[0].data)
    assert o[IP].dst == VTEP_BLUE and o[IP].len == 9216 + 50 - 14 and o[IP].flags.DF
    assert o[VXLAN].vni == BLUE_VNI and bytes(o[VXLAN].payload) == bytes(inner)


def test_jumbo_vxlan_frame_decapsulated_to_the_vm():
    dp = Dataplane.from_topology(topo(9300))
    inner = udp(BLUE_REMOTE_MAC, VM1_MAC, BLUE_REMOTE_IP, VM1_IP, payload=b"D" * (9216 - 42))
    outer = vxlan(inner, BLUE_VNI, VTEP_BLUE)
    assert len(bytes(outer)) == 9266
    outs = dp.process(outer, in_port="p0")
    assert [(o.port, o.data) for o in outs] == [("vm1", bytes(inner))]


def test_jumbo_frame_over_a_1500_underlay_gets_frag_needed():
    dp = Dataplane.from_topology(topo(1500))
    inner = Ether(src=VM1_MAC, dst=BLUE_REMOTE_MAC) / IP(src=VM1_IP, dst=BLUE_REMOTE_IP, flags="DF") / UDP(
        sport=7, dport=9) / Raw(b"J" * (9216 - 42))
    outs = dp.process(inner, in_port="vm1")
    assert [o.port for o in outs] == ["vm1"]
    icmp = Ether(outs[0].data)[ICMP]
    assert (icmp.type, icmp.code, icmp.nexthopmtu) == (3, 4, 1450)
    assert bytes(icmp)[8:28] == bytes(inner[IP])[:20], "quotes the jumbo packet's header"
    assert dp.stats()["ports"]["vm1"]["drops"] == {"mtu": 1}
