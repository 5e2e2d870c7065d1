"""``dpu demo``: the built-in two-tenant topology, generated traffic, replayed
through the native pipeline, with the counters an operator would look at.

Writes into the output directory: topology.yaml, flows.txt (what it compiles
to), in/<port>.pcap (the traffic) and out/<port>.pcap (what came out).
"""
from __future__ import annotations

import json
import os
import time
from typing import Dict, List

import numpy as np

from . import _core, gen
from .dataplane import Dataplane
from .report import Progress, cache_stats, counter_tables, rate_text, tcpreplay_lines, tenant_zones, workers_total

TOPOLOGY = """\
uplink:
  port: p0
  ip: 192.0.2.1
  mac: 02:00:00:00:00:01
  nexthop_mac: 02:00:00:00:00:02
  mtu: 1500
  vxlan_port: 4789
tenants:
  blue:
    vni: 100
    gateway_mac: 02:00:00:00:01:01
    subnets:
      - {cidr: 10.0.0.0/24, gateway: 10.0.0.1}
      - {cidr: 10.0.1.0/24, gateway: 10.0.1.1}
    ports:
      vm1: {mac: 02:00:00:00:01:11, ip: 10.0.0.11}
      vm2: {mac: 02:00:00:00:01:12, ip: 10.0.1.12}
    remote:
      - {vtep: 192.0.2.2, mac: 02:00:00:00:02:21, ip: 10.0.0.21}
    flood: [192.0.2.2]
    nat:
      snat: 203.0.113.10
      floating:
        - {private: 10.0.1.12, public: 203.0.113.12}
      forwards:
        - {proto: tcp, public: 203.0.113.10, port: 8080, to: 10.0.1.12, to_port: 80}
    limits:
      connections: 100000
  red:
    vni: 200
    gateway_mac: 02:00:00:00:01:01
    subnets:
      - {cidr: 10.0.0.0/24, gateway: 10.0.0.1}
    ports:
      vm3: {mac: 02:00:00:00:03:11, ip: 10.0.0.11}
    remote:
      - {vtep: 192.0.2.3, mac: 02:00:00:00:03:21, ip: 10.0.0.21}
    flood: [192.0.2.3]
    nat:
      snat: 203.0.113.20
    limits:
      connections: 1000
internet:
  port: inet
  mac: 02:00:00:00:00:31
  nexthop_mac: 02:00:00:00:00:32
"""

VXLAN_IN = ('Ether(src="02:00:00:00:00:02",dst="02:00:00:00:00:01")/IP(src="{vtep}",dst="192.0.2.1",flags="DF")'
            '/UDP(sport=50000,dport=4789,chksum=0)/VXLAN(flags=0x08,vni={vni})'
            '/Ether(src="{smac}",dst="{dmac}")/IP(src="{sip}",dst="{dip}")/UDP(sport=7000,dport=7001)')

INET_IN = 'Ether(src="02:00:00:00:00:32",dst="02:00:00:00:00:31")/IP(src="{src}",dst="{dst}")/{l4}'

# port -> [(what, share of the traffic, template, flows, vary[, options])]: a
# stream's packets are spread over one second; options: "delay_ns", a late
# start (answers come after the packets they answer), and "at_least", the
# packets the stream sends whatever --packets is (what its text promises).
TRAFFIC: Dict[str, List[tuple]] = {
    "vm1": [
        ("blue vm1 -> remote 10.0.0.21 (VXLAN encap)", 0.25,
         'Ether(src="02:00:00:00:01:11",dst="02:00:00:00:02:21")/IP(src="10.0.0.11",dst="10.0.0.21")/UDP(sport=1,dport=443)', 1000,
         {"udp.sport": "1024-65535"}),
        ("blue vm1 -> vm2 routed via the anycast gateway", 0.2,
         'Ether(src="02:00:00:00:01:11",dst="02:00:00:00:01:01")/IP(src="10.0.0.11",dst="10.0.1.12")/TCP(sport=1,dport=80,flags="S")', 500,
         {"tcp.sport": "1024-65535"}),
        ("blue vm1 ARP for its gateway (answered locally)", 0.04,
         'Ether(src="02:00:00:00:01:11",dst="ff:ff:ff:ff:ff:ff")/ARP(op=1,hwsrc="02:00:00:00:01:11",psrc="10.0.0.11",pdst="10.0.0.1")', None, {}),
        ("blue vm1 broadcast (local + head-end replication)", 0.02,
         'Ether(src="02:00:00:00:01:11",dst="ff:ff:ff:ff:ff:ff")/IP(src="10.0.0.11",dst="10.0.0.255")/UDP(sport=5353,dport=5353)', None, {}),
        ("blue vm1 spoofing a source address (dropped)", 0.02,
         'Ether(src="02:00:00:00:01:11",dst="02:00:00:00:01:12")/IP(src="10.0.0.66",dst="10.0.1.12")/UDP(sport=1,dport=9)', 50,
         {"udp.sport": "1024-65535"}),
        ("blue vm1 -> internet DNS 198.51.100.53 (SNAT to 203.0.113.10)", 0.08,
         'Ether(src="02:00:00:00:01:11",dst="02:00:00:00:01:01")/IP(src="10.0.0.11",dst="198.51.100.53")/UDP(sport=1,dport=53)', 500,
         {"udp.sport": "20000-20499"}),
    ],
    "vm3": [
        ("red vm3 (same IP as vm1) -> its own remote 10.0.0.21", 0.12,
         'Ether(src="02:00:00:00:03:11",dst="02:00:00:00:03:21")/IP(src="10.0.0.11",dst="10.0.0.21")/UDP(sport=1,dport=443)', 1000,
         {"udp.sport": "1024-65535"}),
        ("red vm3 -> blue's remote MAC (isolation drop)", 0.01,
         'Ether(src="02:00:00:00:03:11",dst="02:00:00:00:02:21")/IP(src="10.0.0.11",dst="10.0.0.21")/UDP(sport=1,dport=443)', None, {}),
        ("red vm3 SYN flood to the internet, 3,000 connections (red's quota is 1,000: ct_quota)", 0.04,
         'Ether(src="02:00:00:00:03:11",dst="02:00:00:00:01:01")/IP(src="10.0.0.11",dst="198.51.100.80")/TCP(sport=1,dport=80,flags="S")', 3000,
         {"tcp.sport": "30000-32999"}, {"at_least": 3000}),
    ],
    "p0": [
        ("VXLAN VNI 100 from 192.0.2.2 -> vm1 (decap)", 0.3,
         VXLAN_IN.format(vtep="192.0.2.2", vni=100, smac="02:00:00:00:02:21", dmac="02:00:00:00:01:11", sip="10.0.0.21", dip="10.0.0.11"), 1000,
         {"udp.sport": "49152-65535"}),
        ("VXLAN VNI 200 from blue's VTEP (unknown VTEP, dropped)", 0.02,
         VXLAN_IN.format(vtep="192.0.2.2", vni=200, smac="02:00:00:00:03:21", dmac="02:00:00:00:03:11", sip="10.0.0.21", dip="10.0.0.11"), None, {}),
        ("VXLAN with an unknown VNI (dropped)", 0.02,
         VXLAN_IN.format(vtep="192.0.2.3", vni=999, smac="02:00:00:00:03:21", dmac="02:00:00:00:03:11", sip="10.0.0.21", dip="10.0.0.11"), None, {}),
    ],
    "inet": [
        ("internet DNS answers to 203.0.113.10 (back to vm1 through the SNAT mapping)", 0.08,
         INET_IN.format(src="198.51.100.53", dst="203.0.113.10", l4="UDP(sport=53,dport=1)"), 500,
         {"udp.dport": "20000-20499"}, {"delay_ns": 200_000}),
        ("internet -> floating address 203.0.113.12 (DNAT to vm2)", 0.03,
         INET_IN.format(src="198.51.100.9", dst="203.0.113.12", l4='TCP(sport=1,dport=443,flags="S")'), 200,
         {"tcp.sport": "40000-40199"}),
        ("internet -> forward 203.0.113.10:8080 (DNAT to vm2:80)", 0.03,
         INET_IN.format(src="198.51.100.9", dst="203.0.113.10", l4='TCP(sport=1,dport=8080,flags="S")'), 200,
         {"tcp.sport": "50000-50199"}),
        ("internet -> 203.0.113.10:9999, nothing forwarded there (nat_unsolicited)", 0.01,
         INET_IN.format(src="198.51.100.9", dst="203.0.113.10", l4="UDP(sport=1,dport=9999)"), None, {}),
    ],
}


def _concat_sorted(parts: List[gen.Packets]) -> gen.Packets:
    data = np.concatenate([p.data for p in parts])
    offsets, lengths, ts = [], [], []
    base = 0
    for p in parts:
        offsets.append(p.offsets + np.uint64(base))
        lengths.append(p.lengths)
        ts.append(p.timestamps_ns)
        base += len(p.data)
    offsets, lengths, ts = np.concatenate(offsets), np.concatenate(lengths), np.concatenate(ts)
    order = np.argsort(ts, kind="stable")
    return gen.Packets(data, offsets[order], lengths[order], ts[order])


def make_traffic(in_dir: str, packets: int, progress=None) -> Dict[str, str]:
    """One pcap per port of TRAFFIC's streams; ``progress(done, total, packets)``
    after each stream."""
    os.makedirs(in_dir, exist_ok=True)
    files = {}
    total_share = sum(s for streams in TRAFFIC.values() for _, s, *_ in streams)
    n_streams = sum(len(streams) for streams in TRAFFIC.values())
    done = made = 0
    for port, streams in TRAFFIC.items():
        parts = []
        for k, (_, share, tmpl, flows, vary, *opt) in enumerate(streams):
            options = opt[0] if opt else {}
            n = max(options.get("at_least", 1), int(packets * share / total_share))
            interval = max(1, int(1e9 / n))  # spread every stream over one second
            start = 1_700_000_000 * 10**9 + k * 7 + options.get("delay_ns", 0)
            parts.append(gen.generate(tmpl, n, flows=flows, vary=vary or None, start_ns=start, interval_ns=interval))
            done, made = done + 1, made + n
            if progress:
                progress(done, n_streams, made)
        path = os.path.join(in_dir, f"{port}.pcap")
        _concat_sorted(parts).write_pcap(path)
        files[port] = path
    return files


def io_backends_line() -> str:
    """The live I/O backends this build has. The README's install line runs the demo, so this is
    where a user learns that AF_XDP was left out (pip shows nothing of a build that worked)."""
    if "afxdp" in _core.IO_BACKENDS:
        return "Live I/O built (dpu run --io): afpacket, afxdp"
    return ("Live I/O built (dpu run --io): afpacket only; afxdp needs libxdp-dev, libbpf-dev and pkg-config when "
            "dpu is built: install them, then rebuild (python3 setup.py build_ext --inplace --force, or pip install "
            "-e '.[test]' again)")


def run_demo(out_dir: str = "dpu-demo", packets: int = 200_000, as_json: bool = False) -> int:
    os.makedirs(out_dir, exist_ok=True)
    topo_path = os.path.join(out_dir, "topology.yaml")
    with open(topo_path, "w") as f:
        f.write(TOPOLOGY)
    t0 = time.perf_counter()
    dp = Dataplane.from_topology(topo_path)
    load_s = time.perf_counter() - t0
    with open(os.path.join(out_dir, "flows.txt"), "w") as f:
        f.write(dp.topology.text())
    t0 = time.perf_counter()
    bar = Progress(not as_json, "generating")
    inputs = make_traffic(os.path.join(out_dir, "in"), packets, progress=bar)
    gen_s = time.perf_counter() - t0
    bar.label = "replaying"
    try:
        summary = dp.replay(inputs, os.path.join(out_dir, "out"), progress=bar)
    finally:
        bar.close()
    st = dp.stats()
    if as_json:
        total = workers_total(st)
        print(json.dumps({"replay": summary.as_dict(), "tables": st["tables"], "tenants": st["tenants"],
                          "workers_total": total, "pmd": total, "workers": st["workers"],
                          "cache": cache_stats(total), "conntrack": st["conntrack"], "flows": len(dp.dump_flows())},
                         sort_keys=True))
        return 0
    print(f"dpu demo: {len(dp.dump_flows())} flows compiled from {topo_path} in {load_s * 1e3:.0f} ms; "
          f"{summary.packets_in:,} packets generated in {gen_s:.2f}s\n")
    print("Traffic:")
    for port, streams in TRAFFIC.items():
        for what, *_ in streams:
            print(f"  {port:<4} {what}")
    print()
    print(counter_tables(st, ports=summary.ports, zones=tenant_zones(dp), connections=dp.conntrack()[:3]))
    print(f"Rate: {summary.packets_in:,} packets in {summary.seconds:.3f}s = {rate_text(summary.pps)} "
          f"(read pcaps, process, write pcaps; one core)")
    print("\n".join(tcpreplay_lines(summary.packets_in, summary.bytes_in, summary.seconds)))
    print(f"\nWrote {out_dir}/topology.yaml, {out_dir}/flows.txt, {out_dir}/in/*.pcap, {out_dir}/out/*.pcap")
    print(io_backends_line())
    return 0
