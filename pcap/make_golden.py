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

from scapy.all import ARP, IP, TCP, UDP, Ether, ICMP, Raw, wrpcap  # noqa: E402
from scapy.layers.vxlan import VXLAN  # noqa: E402

TOPOLOGY = os.path.join(HERE, "..", "examples", "topology.yaml")

# case -> how to build the dataplane, input port, output port
CASES = {
    "l3-rewrite": {"flows": "l3-rewrite.flows", "ports": ["p1", "r1"], "in": "p1", "out": "r1"},
    "vxlan-encap": {"config": TOPOLOGY, "in": "vm1", "out": "p0"},
    "vxlan-decap": {"config": TOPOLOGY, "in": "p0", "out": "vm1"},
    "arp-suppression": {"config": TOPOLOGY, "in": "vm1", "out": "vm1"},
}


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
    src = os.path.join(HERE, f"{case}.in.pcap")
    wrpcap(src, traffic(case, random.Random(case)))
    out_dir = tempfile.mkdtemp()
    try:
        build_dataplane(spec).replay({spec["in"]: src}, out_dir)
        shutil.copy(os.path.join(out_dir, f"{spec['out']}.pcap"), os.path.join(HERE, f"{case}.out.pcap"))
    finally:
        shutil.rmtree(out_dir)
    print(f"{case}: {src} -> {case}.out.pcap")


if __name__ == "__main__":
    for c in sys.argv[1:] or CASES:
        make(c)
