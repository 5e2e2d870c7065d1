#!/usr/bin/env python3
"""Regenerates the golden captures: pcap/<case>.in.pcap (built with scapy, fixed
seed and timestamps) and pcap/<case>.out.pcap (what dpu emits on the case's
output port). Review the diff of any regenerated .out.pcap before committing:
tests/test_golden.py replays every case and requires the same bytes.

    python3 pcap/make_golden.py            # all cases
    python3 pcap/make_golden.py vxlan-encap
"""
import os
import random
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

from scapy.all import ARP, DNS, DNSQR, DNSRR, IP, TCP, UDP, Ether, ICMP, Raw, wrpcap  # noqa: E402
from scapy.layers.vxlan import VXLAN  # noqa: E402

TOPOLOGY = os.path.join(HERE, "..", "examples", "topology.yaml")
NAT = os.path.join(HERE, "..", "examples", "nat-gateway.yaml")

# case -> how to build the dataplane, input port(s), output port(s). A case
# with one input and one output port is the pair <case>.in.pcap /
# <case>.out.pcap; with several, each port has <case>.<port>.in.pcap /
# <case>.<port>.out.pcap (the inputs interleaved by timestamp, as dpu replay does).
CASES = {
    "l3-rewrite": {"flows": "l3-rewrite.flows", "ports": ["p1", "r1"], "in": "p1", "out": "r1"},
    "vxlan-encap": {"config": TOPOLOGY, "in": "vm1", "out": "p0"},
    "vxlan-decap": {"config": TOPOLOGY, "in": "p0", "out": "vm1"},
    "arp-suppression": {"config": TOPOLOGY, "in": "vm1", "out": "vm1"},
    # the internet gateway of examples/nat-gateway.yaml
    "nat-snat": {"config": NAT, "in": ["vm1", "vm2", "inet"], "out": ["inet", "vm1", "vm2"]},
    "nat-dnat": {"config": NAT, "in": ["inet", "vm2"], "out": ["vm2", "inet"]},
    "nat-hairpin": {"config": NAT, "in": ["vm1", "vm2"], "out": ["vm2", "vm1"]},
    "nat-icmp-error": {"config": NAT, "in": ["vm1", "inet"], "out": ["inet", "vm1"]},
}


def ports_of(spec, key):
    v = spec[key]
    return v if isinstance(v, list) else [v]


def in_file(case, port):
    spec = CASES[case]
    return os.path.join(HERE, f"{case}.in.pcap" if not isinstance(spec["in"], list) else f"{case}.{port}.in.pcap")


def out_file(case, port):
    spec = CASES[case]
    return os.path.join(HERE, f"{case}.out.pcap" if not isinstance(spec["out"], list) else f"{case}.{port}.out.pcap")


INET_MAC, NEXTHOP = "02:00:00:00:00:31", "02:00:00:00:00:32"
GW = "02:00:00:00:01:01"
VM1 = ("02:00:00:00:01:11", "10.0.0.11")
VM2 = ("02:00:00:00:01:12", "10.0.1.12")


def _from_vm(vm, dst, l4, ttl=64):
    return Ether(src=vm[0], dst=GW) / IP(src=vm[1], dst=dst, ttl=ttl) / l4


def _from_inet(src, dst, l4):
    return Ether(src=NEXTHOP, dst=INET_MAC) / IP(src=src, dst=dst) / l4


def nat_traffic(case, rng):
    """(port, packet) in time order; each answer comes after what it answers."""
    seq = []
    if case == "nat-snat":
        for i in range(12):
            vm = VM1 if i % 3 else VM2  # vm2 leaves through its floating address 203.0.113.12
            server = "198.51.100.%d" % (1 + i % 4)
            pub = "203.0.113.10" if vm is VM1 else "203.0.113.12"
            port = "vm1" if vm is VM1 else "vm2"
            sport = 40000 + i
            kind = i % 3
            if kind == 0:
                seq.append((port, _from_vm(vm, server, TCP(sport=sport, dport=443, flags="S", seq=1000 + i))))
                seq.append(("inet", _from_inet(server, pub, TCP(sport=443, dport=sport, flags="SA", seq=7000, ack=1001 + i))))
                seq.append((port, _from_vm(vm, server, TCP(sport=sport, dport=443, flags="A", seq=1001 + i, ack=7001))))
            elif kind == 1:
                q = DNS(id=i, rd=1, qd=DNSQR(qname=f"host{i}.example.com"))
                seq.append((port, _from_vm(vm, server, UDP(sport=sport, dport=53) / q)))
                a = DNS(id=i, qr=1, rd=1, ra=1, qd=DNSQR(qname=f"host{i}.example.com"),
                        an=DNSRR(rrname=f"host{i}.example.com", rdata="198.51.100.%d" % (100 + i)))
                seq.append(("inet", _from_inet(server, pub, UDP(sport=53, dport=sport) / a)))
            else:
                seq.append((port, _from_vm(vm, server, ICMP(type=8, id=sport, seq=1) / Raw(b"ping"))))
                seq.append(("inet", _from_inet(server, pub, ICMP(type=0, id=sport, seq=1) / Raw(b"ping"))))
    elif case == "nat-dnat":
        for i in range(10):
            client = "198.51.100.%d" % (20 + i)
            if i % 2:  # the floating address: every port
                l4 = TCP(sport=50000 + i, dport=22, flags="S")
                seq.append(("inet", _from_inet(client, "203.0.113.12", l4)))
                seq.append(("vm2", _from_vm(VM2, client, TCP(sport=22, dport=50000 + i, flags="SA", ack=1))))
            else:  # the forward 203.0.113.10:8080 -> 10.0.1.12:80
                l4 = TCP(sport=51000 + i, dport=8080, flags="S")
                seq.append(("inet", _from_inet(client, "203.0.113.10", l4)))
                seq.append(("vm2", _from_vm(VM2, client, TCP(sport=80, dport=51000 + i, flags="SA", ack=1))))
        seq.append(("inet", _from_inet("198.51.100.99", "203.0.113.10", UDP(sport=1, dport=9999))))  # unsolicited
    elif case == "nat-hairpin":
        for i in range(6):
            if i % 2:
                seq.append(("vm1", _from_vm(VM1, "203.0.113.12", UDP(sport=7000 + i, dport=7) / Raw(b"hairpin"))))
                seq.append(("vm2", _from_vm(VM2, "203.0.113.10", UDP(sport=7, dport=7000 + i) / Raw(b"hairpin"))))
            else:
                seq.append(("vm1", _from_vm(VM1, "203.0.113.10", TCP(sport=41000 + i, dport=8080, flags="S"))))
                seq.append(("vm2", _from_vm(VM2, "203.0.113.10", TCP(sport=80, dport=41000 + i, flags="SA", ack=1))))
    elif case == "nat-icmp-error":
        for i in range(8):
            server = "198.51.100.%d" % (30 + i)
            l4 = UDP(sport=33000 + i, dport=33434 + i) / Raw(b"trace") if i % 2 else TCP(sport=42000 + i, dport=80, flags="S", seq=5)
            out = _from_vm(VM1, server, l4)
            seq.append(("vm1", out))
            # what the internet sees of it: the SNAT'ed packet (source port kept)
            seen = IP(src="203.0.113.10", dst=server, ttl=63) / l4
            icmp = [ICMP(type=3, code=3), ICMP(type=11, code=0), ICMP(type=3, code=4, nexthopmtu=1400),
                    ICMP(type=3, code=1)][i % 4]
            seq.append(("inet", _from_inet("198.51.100.254", "203.0.113.10", icmp / seen)))
    return seq


def write_inputs(case, rng):
    spec = CASES[case]
    seq = nat_traffic(case, rng)
    per_port = {p: [] for p in ports_of(spec, "in")}
    for i, (port, p) in enumerate(seq):
        p = Ether(bytes(p))
        p.time = 1_700_000_000 + i * 0.001
        per_port[port].append(p)
    for port, pkts in per_port.items():
        wrpcap(in_file(case, port), pkts)


def traffic(case, rng):
    pkts = []
    if case == "l3-rewrite":
        for i in range(60):
            dst = rng.choice(["10.0.0.%d", "10.0.1.%d", "10.9.9.%d"]) % rng.randrange(1, 250)
            ttl = rng.choice([64, 64, 64, 1])
            l4 = UDP(sport=rng.randrange(20000, 30000), dport=rng.choice([4001, 20001, 30000])) if i % 3 else TCP(sport=20000 + i, dport=25000, flags="S")
            pkts.append(Ether(src="02:00:00:00:0a:01", dst="02:00:00:00:0f:01") / IP(src="10.2.0.%d" % (i + 1), dst=dst, ttl=ttl, id=i) / l4 / Raw(b"g" * (i % 17)))
    elif case == "vxlan-encap":
        for i in range(40):
            dst_mac, dst_ip = ("02:00:00:00:02:21", "10.0.0.21") if i % 2 else ("02:00:00:00:01:01", "10.0.0.21")
            pkts.append(Ether(src="02:00:00:00:01:11", dst=dst_mac) / IP(src="10.0.0.11", dst=dst_ip, id=i) / UDP(sport=21000 + i, dport=22000) / Raw(b"e" * i))
    elif case == "vxlan-decap":
        for i in range(40):
            inner = Ether(src="02:00:00:00:02:21", dst="02:00:00:00:01:11") / IP(src="10.0.0.21", dst="10.0.0.11", id=i) / UDP(sport=23000 + i, dport=24000) / Raw(b"d" * i)
            vni, vtep = [(100, "192.0.2.2"), (100, "192.0.2.9"), (200, "192.0.2.2"), (300, "192.0.2.2")][i % 4]
            pkts.append(Ether(src="02:00:00:00:00:02", dst="02:00:00:00:00:01") / IP(src=vtep, dst="192.0.2.1", flags="DF") / UDP(sport=50000 + i, dport=4789, chksum=0) / VXLAN(flags=0x08, vni=vni) / inner)
    elif case == "arp-suppression":
        for i, target in enumerate(["10.0.0.1", "10.0.0.21", "10.0.1.12", "10.0.0.99", "10.0.1.1"] * 4):
            pkts.append(Ether(src="02:00:00:00:01:11", dst="ff:ff:ff:ff:ff:ff") / ARP(op=1, hwsrc="02:00:00:00:01:11", psrc="10.0.0.11", pdst=target))
    for i, p in enumerate(pkts):
        p.time = 1_700_000_000 + i * 0.001
    return pkts


def build_dataplane(spec):
    from dpu import Dataplane

    if "config" in spec:
        return Dataplane.from_topology(spec["config"])
    dp = Dataplane(ports=spec["ports"])
    dp.load_flows(os.path.join(HERE, spec["flows"]))
    return dp


def make(case):
    spec = CASES[case]
    if isinstance(spec["in"], list):
        write_inputs(case, random.Random(case))
    else:
        wrpcap(in_file(case, spec["in"]), traffic(case, random.Random(case)))
    out_dir = tempfile.mkdtemp()
    try:
        build_dataplane(spec).replay({p: in_file(case, p) for p in ports_of(spec, "in")}, out_dir)
        for p in ports_of(spec, "out"):
            shutil.copy(os.path.join(out_dir, f"{p}.pcap"), out_file(case, p))
    finally:
        shutil.rmtree(out_dir)
    print(f"{case}: " + ", ".join(os.path.basename(out_file(case, p)) for p in ports_of(spec, "out")))


if __name__ == "__main__":
    for c in sys.argv[1:] or CASES:
        make(c)
