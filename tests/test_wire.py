"""What dpu writes is valid on the wire: tshark, with checksum validation on,
decodes every output packet (outer and inner) with no malformed packet and no
bad checksum."""
import os
import random

from scapy.all import ICMP, IP, TCP, UDP, Dot1Q, Ether, ICMPv6EchoRequest, IPv6, Raw, wrpcap
from scapy.layers.vxlan import VXLAN

from dpu import Dataplane
from helpers.packets import BLUE_REMOTE_IP, BLUE_REMOTE_MAC, BLUE_VNI, BROADCAST, VM1_IP, VM1_MAC, VM2_IP, VM2_MAC, VTEP_BLUE, udp, vxlan
from helpers.tshark import assert_clean, tshark_fields

TOPO = os.path.join(os.path.dirname(__file__), "..", "examples", "topology.yaml")


def random_packets(rng, n):
    E = lambda: Ether(src="02:00:00:00:00:%02x" % rng.randrange(1, 200), dst="02:00:00:00:00:bb")  # noqa: E731
    pkts = []
    for i in range(n):
        sport, dport = rng.randrange(20000, 30000), rng.randrange(20000, 30000)
        pay = Raw(bytes(rng.randrange(256) for _ in range(rng.randrange(0, 60))))
        kind = rng.randrange(7)
        ip = IP(src="10.1.%d.%d" % (rng.randrange(4), rng.randrange(1, 250)), dst="10.0.0.%d" % rng.randrange(1, 250),
                ttl=rng.randrange(2, 255), tos=rng.randrange(256), id=i)
        if kind == 0:
            p = E() / ip / UDP(sport=sport, dport=dport) / pay
        elif kind == 1:
            p = E() / ip / UDP(sport=sport, dport=dport, chksum=0) / pay
        elif kind == 2:
            p = E() / ip / TCP(sport=sport, dport=dport, flags="PA", seq=rng.randrange(1 << 32)) / pay
        elif kind == 3:
            p = E() / ip / ICMP(type=8, id=i, seq=1) / pay
        elif kind == 4:
            p = E() / IPv6(src="2001:db8::%x" % rng.randrange(1, 999), dst="2001:db8:1::5", hlim=rng.randrange(2, 255)) / UDP(sport=sport, dport=dport) / pay
        elif kind == 5:
            p = E() / IPv6(src="2001:db8::7", dst="2001:db8:1::5") / ICMPv6EchoRequest(id=i) / pay
        else:
            p = E() / Dot1Q(vlan=rng.randrange(1, 4000)) / ip / UDP(sport=sport, dport=dport) / pay
        pkts.append(Ether(bytes(p)))
    return pkts


def test_rewritten_packets_are_valid(tmp_path, tshark):
    rng = random.Random(7)
    pkts = random_packets(rng, 400)
    for i, p in enumerate(pkts):
        p.time = 1000 + i / 1000
    src = tmp_path / "in.pcap"
    wrpcap(str(src), pkts)
    dp = Dataplane(ports=["in", "a", "b", "c", "d"], flows=[
        "table=0,priority=10,dl_vlan=0xffff,udp,actions=mod_nw_src:192.168.99.1,mod_tp_dst:443,dec_ttl,goto_table:1",
        "table=0,priority=10,dl_vlan=0xffff,tcp,actions=mod_nw_dst:172.16.0.9,mod_tp_src:8080,mod_nw_tos:40,output:a",
        "table=0,priority=10,icmp,actions=mod_nw_dst:172.16.0.10,dec_ttl,output:b",
        "table=0,priority=10,udp6,actions=set_field:2001:db8:ffff::1->ipv6_dst,set_field:7777->udp_dst,dec_ttl,output:c",
        "table=0,priority=10,icmp6,actions=set_field:2001:db8:eeee::1->ipv6_src,output:c",
        "table=0,priority=20,dl_vlan=0xffff,udp,nw_src=10.1.0.0/16,tp_src=0x4e00/0xff00,actions=push_vlan:0x8100,mod_vlan_vid:33,output:d",
        "table=0,priority=5,actions=pop_vlan,mod_dl_dst:02:00:00:00:00:99,output:d",
        "table=1,actions=output:a,mod_tp_src:9,output:b",
    ])
    s = dp.replay({"in": str(src)}, tmp_path / "out")
    assert s.packets_in == 400 and s.packets_out >= 400
    for port in "abcd":
        n = s.ports[port]["tx_packets"]
        assert n > 0
        assert_clean(tshark, tmp_path / "out" / f"{port}.pcap", n)


def test_overlay_output_is_valid_vxlan(tmp_path, tshark):
    rng = random.Random(3)
    inputs = []
    for i in range(120):
        sport, dport = rng.randrange(20000, 30000), rng.randrange(20000, 30000)
        pay = Raw(bytes(rng.randrange(256) for _ in range(rng.randrange(0, 80))))
        kind = i % 4
        if kind == 0:   # bridged to the remote endpoint: encapsulated
            p = Ether(src=VM1_MAC, dst=BLUE_REMOTE_MAC) / IP(src=VM1_IP, dst=BLUE_REMOTE_IP) / UDP(sport=sport, dport=dport) / pay
        elif kind == 1:  # routed to the remote endpoint
            p = Ether(src=VM1_MAC, dst="02:00:00:00:01:01") / IP(src=VM1_IP, dst=BLUE_REMOTE_IP) / TCP(sport=sport, dport=dport) / pay
        elif kind == 2:  # broadcast: vm2 + head-end replication
            p = Ether(src=VM1_MAC, dst=BROADCAST) / IP(src=VM1_IP, dst="10.0.0.255") / UDP(sport=sport, dport=dport) / pay
        else:            # too big with DF: ICMP fragmentation needed back to vm1
            p = Ether(src=VM1_MAC, dst=BLUE_REMOTE_MAC) / IP(src=VM1_IP, dst=BLUE_REMOTE_IP, flags="DF") / UDP(sport=sport, dport=dport) / Raw(b"z" * 1480)
        p = Ether(bytes(p))
        p.time = 10 + i
        inputs.append(p)
    wrpcap(str(tmp_path / "vm1.pcap"), inputs)
    fabric = []
    for i in range(30):
        inner = udp(BLUE_REMOTE_MAC, VM1_MAC, BLUE_REMOTE_IP, VM1_IP, sport=21000 + i, dport=22000)
        p = Ether(bytes(vxlan(inner, BLUE_VNI, VTEP_BLUE, sport=50000 + i, udp_chksum=None if i % 2 else 0)))
        p.time = 10.5 + i
        fabric.append(p)
    wrpcap(str(tmp_path / "p0.pcap"), fabric)
    dp = Dataplane.from_topology(TOPO)
    s = dp.replay({"vm1": str(tmp_path / "vm1.pcap"), "p0": str(tmp_path / "p0.pcap")}, tmp_path / "out")
    p0 = tmp_path / "out" / "p0.pcap"
    assert_clean(tshark, p0, s.ports["p0"]["tx_packets"])
    vx = tshark_fields(tshark, p0, ["vxlan.vni", "ip.dst", "udp.dstport"], "vxlan")
    assert len(vx) == 90 and all(v[0] == "100" and v[1].startswith(VTEP_BLUE) and v[2].startswith("4789") for v in vx)
    vm1 = tmp_path / "out" / "vm1.pcap"
    assert_clean(tshark, vm1, 30 + 30)  # 30 ICMP errors + 30 decapsulated
    icmp = tshark_fields(tshark, vm1, ["icmp.type", "icmp.code", "icmp.mtu"], "icmp")
    assert icmp and all(r == ["3", "4", "1450"] for r in icmp)
    assert_clean(tshark, tmp_path / "out" / "vm2.pcap", 30)


def test_ipv6_underlay_is_valid(tmp_path, tshark):
    import yaml

    with open(TOPO) as f:
        t = yaml.safe_load(f)
    t["uplink"]["ip"] = "2001:db8::1"
    t["tenants"]["blue"]["remote"][0]["vtep"] = "2001:db8::2"
    t["tenants"]["blue"]["flood"] = ["2001:db8::2"]
    t["tenants"]["red"]["remote"][0]["vtep"] = "2001:db8::3"
    t["tenants"]["red"]["flood"] = ["2001:db8::3"]
    dp = Dataplane.from_topology(t)
    pkts = []
    for i in range(40):
        p = Ether(bytes(Ether(src=VM1_MAC, dst=BLUE_REMOTE_MAC) / IP(src=VM1_IP, dst=BLUE_REMOTE_IP) / UDP(sport=20000 + i, dport=25000) / Raw(b"6" * i)))
        p.time = i
        pkts.append(p)
    wrpcap(str(tmp_path / "vm1.pcap"), pkts)
    dp.replay({"vm1": str(tmp_path / "vm1.pcap")}, tmp_path / "out")
    p0 = tmp_path / "out" / "p0.pcap"
    assert_clean(tshark, p0, 40)
    rows = tshark_fields(tshark, p0, ["ipv6.dst", "udp.checksum.status", "vxlan.vni"], "vxlan")
    # udp.checksum.status is reported for the outer and the inner UDP header: both good (1)
    assert len(rows) == 40 and all(r[0] == "2001:db8::2" and set(r[1].split(",")) == {"1"} and r[2] == "100" for r in rows)
