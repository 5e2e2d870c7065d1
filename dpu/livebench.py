"""Live forwarding benchmarks: veth pairs in namespaces, 64-byte frames
(``dpu bench live-l3 live-vxlan live-snat``; bench/live_bench.py adds Open
vSwitch and prints ratios).

    gen ns: g0 ══ in0 :dut ns: out0 ══ s0 :sink ns

A blaster (dpu.traffic, AF_PACKET sendmmsg) in the gen namespace sends as
fast as the kernel takes frames into g0; the device under test (``dpu run``,
or ovs-vswitchd with ``datapath_type=netdev``) forwards in0 -> out0; the
forwarded rate is what s0 receives (its kernel counter, read twice during
the measured window: the sink costs nothing extra). The offered rate is
what the blaster got into g0, so a result shows both the rate at overload
and how much was offered. The raw ceiling is the same blaster into g0 with
only a counting TPACKET_V3 receiver on in0.

CPUs: with two or more, the blaster (and the kernel work its sends cause,
which runs on the sending CPU) is pinned to the first CPU and the device
under test (or the ceiling's receiver) to the others, so the generator never
takes the device's core. A device with more threads than the remaining CPUs
runs unpinned, and its result says so ("pinned": false).

Where the kernel's receive work for in0 runs (``kernel_rx``): "gen", the
default, leaves it on the sending CPU, so the blaster's CPU also runs in0's
XDP program and AF_XDP's copy, and an AF_XDP device is measured at what that
CPU can offer. "dut" turns on threaded NAPI for in0 (GRO on, so that a veth
runs NAPI without XDP too) and pins its kernel thread to the device's CPU:
the one-core case of a real NIC whose interrupts land on the forwarding core,
where a device that polls without ever yielding starves the kernel's receive
work (receive livelock) and one that yields shares the core with it.

Everything lives in namespaces this module creates (names dpub<pid>-*) and
deletes; nothing is configured in the machine's own namespace. Needs root.
The rig is removed however the process ends (dpu.cleanup): by close(), at
exit, and on SIGTERM, SIGINT or SIGHUP, with every process running in its
namespaces (dpu run, ovsdb-server, ovs-vswitchd, the traffic tools) and its
temporary directory.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import List, Optional

from . import _core, cleanup
from .errors import DpuError

GEN_MAC, IN_MAC, OUT_MAC, SINK_MAC = "02:00:00:00:e0:01", "02:00:00:00:e0:02", "02:00:00:00:e0:03", "02:00:00:00:e0:04"
# The generator addresses frames to a gateway MAC that is not in0's own, as frames for a
# dataplane's port are (a VM sends to its gateway): the devices under test take them in
# promiscuous mode. A frame addressed to in0 itself would also go up the dut namespace's IP
# stack (a failed route lookup, a dst made and freed per frame), on the generator's CPU: a
# third of what one core could offer. The sink's frames (NEXTHOP, the VTEP's MAC too) are not
# s0's either: its kernel counts and drops them before IP, on the device under test's CPU.
GW_MAC = "02:00:00:00:e0:0a"
FLOW_COUNTS = (1000, 100_000)
OVS_PMD_MAXSLEEP_US = 1000  # with kernel_rx "dut" (OvsRun)
WARM_S, MEASURE_S = 1.0, 3.0


class BenchError(DpuError):
    """A live benchmark could not be set up (no root, a tool missing)."""


def _sh(*args: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
    r = subprocess.run(list(args), capture_output=True, text=True, **kw)
    if check and r.returncode != 0:
        raise BenchError(f"{' '.join(args)}: {r.stderr.strip() or r.returncode}")
    return r


# ---- the rig ------------------------------------------------------------------------------------

class Rig:
    """Three namespaces and two veth pairs (see the module docstring)."""

    def __init__(self, queues: int = 1, kernel_rx: str = "gen") -> None:
        if kernel_rx not in ("gen", "dut"):
            raise BenchError(f"kernel_rx must be gen or dut, not {kernel_rx!r}")
        self.queues = queues
        self.kernel_rx = kernel_rx
        cpus = sorted(os.sched_getaffinity(0))
        self.gen_cpus = cpus[:1] if len(cpus) >= 2 else []
        self.dut_cpus = cpus[1:] if len(cpus) >= 2 else []
        if os.geteuid() != 0:
            raise BenchError("live benchmarks need root (network namespaces, AF_PACKET)")
        tag = f"dpub{os.getpid()}"
        self.ns = {k: f"{tag}-{k}" for k in ("gen", "dut", "sink")}
        self.tmp: Optional[str] = None
        # registered before anything exists, so that a signal from here on finds all of it
        self._cleanup = cleanup.register(self._remove)
        try:
            with cleanup.deferred():
                self.tmp = tempfile.mkdtemp(prefix="dpu-livebench-")
            for ns in self.ns.values():
                with cleanup.deferred():
                    _sh("ip", "netns", "add", ns)
                _sh("ip", "-n", ns, "link", "set", "lo", "up")
                for scope in ("default", "all"):
                    _sh("ip", "netns", "exec", ns, "sysctl", "-q", "-w", f"net.ipv6.conf.{scope}.disable_ipv6=1",
                        check=False)
            q = ["numrxqueues", str(queues), "numtxqueues", str(queues)]
            for (na, a, ma), (nb, b, mb) in (((self.ns["gen"], "g0", GEN_MAC), (self.ns["dut"], "in0", IN_MAC)),
                                             ((self.ns["dut"], "out0", OUT_MAC), (self.ns["sink"], "s0", SINK_MAC))):
                _sh("ip", "link", "add", "name", a, "netns", na, "address", ma, *q, "type", "veth", "peer", "name", b,
                    "netns", nb, "address", mb, *q)
                _sh("ip", "-n", na, "link", "set", a, "up")
                _sh("ip", "-n", nb, "link", "set", b, "up")
            if kernel_rx == "dut":
                _sh(*self.exec("dut", "ethtool", "-K", "in0", "gro", "on"))
                _sh(*self.exec("dut", "sh", "-c", "echo 1 > /sys/class/net/in0/threaded"))
        except BaseException:
            self.close()
            raise

    def set_queues(self, n: int) -> None:
        """n queues on both ends of both veth pairs. An AF_XDP device under test reads one queue per
        worker (dpu) or per configured rxq (OVS: one), and what the kernel puts on another queue
        never reaches it; native XDP on a veth also wants its receive queues to cover the peer's
        transmit queues. AF_PACKET reads every queue, whatever n is."""
        if n == self.queues:
            return
        for where, dev in (("gen", "g0"), ("dut", "in0"), ("dut", "out0"), ("sink", "s0")):
            _sh(*self.exec(where, "ethtool", "-L", dev, "rx", str(n), "tx", str(n)))
        self.queues = n

    def close(self) -> None:
        self._cleanup.run()

    def _remove(self) -> None:
        """Everything the rig made: the processes in its namespaces (dpu run, ovsdb-server,
        ovs-vswitchd, the traffic tools), the namespaces, the temporary directory. Run by
        close(), or by dpu.cleanup on SIGTERM, SIGINT or an exit that skipped close()."""
        for ns in self.ns.values():
            cleanup.netns_remove(ns)
        if self.tmp:
            shutil.rmtree(self.tmp, ignore_errors=True)

    def __enter__(self) -> "Rig":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def exec(self, where: str, *args: str) -> List[str]:
        return ["ip", "netns", "exec", self.ns[where], *args]

    def spawn(self, where: str, args: List[str], **kw) -> subprocess.Popen:
        """args started in namespace `where`, ended with it (close()) or, should this process die
        without closing the rig (SIGKILL), by the kernel (cleanup.die_with_parent)."""
        return subprocess.Popen(self.exec(where, *args), preexec_fn=cleanup.die_with_parent, **kw)

    def pinned(self, cpus: List[int], *args: str) -> List[str]:
        """args run on `cpus` only (taskset), or anywhere when there is no CPU to spare."""
        return ["taskset", "-c", ",".join(map(str, cpus)), *args] if cpus else list(args)

    def dut_pin(self, threads: int) -> List[int]:
        """The CPUs a device under test with `threads` busy threads runs on: the generator's
        are left out when the rest give each thread a CPU, else none (unpinned)."""
        return self.dut_cpus if 0 < threads <= len(self.dut_cpus) else []

    def pin_kernel_rx(self) -> None:
        """With kernel_rx "dut": in0's NAPI threads onto the device's CPUs. A device that
        attaches XDP (or a change of queues) makes new ones, so this runs before each
        measurement. Their names do not say which namespace's in0 they serve: all of
        them are moved (the rigs of one run are made one after the other)."""
        if self.kernel_rx != "dut" or not self.dut_cpus:
            return
        pids = _sh("pgrep", "^napi/in0-", check=False).stdout.split()
        if not pids:
            raise BenchError("kernel_rx dut: in0 has no NAPI thread (threaded NAPI not supported?)")
        for pid in pids:
            _sh("taskset", "-pc", ",".join(map(str, self.dut_cpus)), pid, check=False)

    def sink_rx(self) -> int:
        out = _sh("ip", "-n", self.ns["sink"], "-s", "-j", "link", "show", "s0").stdout
        return int(json.loads(out)[0]["stats64"]["rx"]["packets"])

    def blaster(self, pcap: str, seconds: float) -> subprocess.Popen:
        return self.spawn("gen", self.pinned(self.gen_cpus, sys.executable, "-m", "dpu.traffic", "blast", "--if", "g0",
                                             "--pcap", pcap, "--seconds", str(seconds)),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def raw_ceiling(self, pcap: str, seconds: float = MEASURE_S) -> dict:
        """Blaster into g0, a counting receiver on in0 (what one core reads from a veth)."""
        counter = self.spawn("dut", self.pinned(self.dut_pin(1), sys.executable, "-m", "dpu.traffic", "count", "--if",
                                                "in0", "--seconds", str(seconds + WARM_S)),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(0.3)
        self.pin_kernel_rx()
        b = self.blaster(pcap, seconds + WARM_S)
        sent = _json(b)
        got = _json(counter)
        return {"offered_mpps": round(sent["pps"] / 1e6, 3), "mpps": round(got["pps"] / 1e6, 3)}

    def forwarded(self, pcap: str, seconds: float = MEASURE_S, busy=None) -> dict:
        """The blaster into g0 for warm-up + seconds; the sink's count over the last `seconds`.
        `busy()`, when given, returns the device's (busy ns, busy + idle ns) so far: their
        share over the same window is its load at the rate it forwarded."""
        self.pin_kernel_rx()
        b = self.blaster(pcap, WARM_S + seconds + 0.5)
        time.sleep(WARM_S)
        b0 = busy() if busy else None
        c0, t0 = self.sink_rx(), time.monotonic()
        time.sleep(seconds)
        c1, t1 = self.sink_rx(), time.monotonic()
        b1 = busy() if busy else None
        sent = _json(b)
        out = {"mpps": round((c1 - c0) / (t1 - t0) / 1e6, 3), "offered_mpps": round(sent["pps"] / 1e6, 3)}
        if b0 and b1 and b1[1] > b0[1]:
            out["busy_ratio"] = round((b1[0] - b0[0]) / (b1[1] - b0[1]), 3)
        return out


def _json(p: subprocess.Popen) -> dict:
    out, err = p.communicate(timeout=120)
    if p.returncode != 0:
        raise BenchError(f"traffic tool failed: {err.strip()}")
    return json.loads(out.strip().splitlines()[-1])


# ---- traffic and configurations per scenario ------------------------------------------------------

N_ROUTES = 1000
NEXTHOP = "02:00:00:00:0f:02"


def _ip(base: str, i: int) -> str:
    a, b, c, d = (int(x) for x in base.split("."))
    v = (a << 24 | b << 16 | c << 8 | d) + i
    return f"{v >> 24 & 255}.{v >> 16 & 255}.{v >> 8 & 255}.{v & 255}"


def l3_flows() -> List[str]:
    return [f"table=0,priority=100,in_port=in0,ip,nw_dst={_ip('10.0.0.0', i)},"
            f"actions=mod_dl_src:{OUT_MAC},mod_dl_dst:{NEXTHOP},dec_ttl,output:out0" for i in range(N_ROUTES)]


def snat_flows() -> List[str]:
    # one-way UDP stays +new: every packet takes the commit (a no-op once the connection exists)
    return ["table=0,priority=100,in_port=in0,ip,actions=ct(zone=1,nat,table=1)",
            "table=1,priority=100,ct_state=+trk+new,ip,actions=ct(commit,zone=1,nat(src=203.0.113.10-203.0.113.13),table=2)",
            "table=1,priority=90,ct_state=+trk+est,ip,actions=goto_table:2",
            "table=1,priority=0,actions=drop",
            f"table=2,priority=100,ip,actions=mod_dl_src:{OUT_MAC},mod_dl_dst:{NEXTHOP},dec_ttl,output:out0"]


VXLAN_ENDPOINTS = 1000


def vxlan_topology() -> str:
    remote = "\n".join(f"      - {{vtep: 192.0.2.2, mac: '02:00:00:01:{i >> 8 & 255:02x}:{i & 255:02x}', "
                       f"ip: {_ip('10.0.0.100', i)}}}" for i in range(VXLAN_ENDPOINTS))
    return f"""uplink:
  port: out0
  ip: 192.0.2.1
  mac: {OUT_MAC}
  nexthop_mac: {NEXTHOP}
tenants:
  blue:
    vni: 100
    gateway_mac: 02:00:00:00:01:01
    subnets:
      - {{cidr: 10.0.0.0/16, gateway: 10.0.0.1}}
    ports:
      in0: {{mac: '{GEN_MAC}', ip: 10.0.0.11}}
    remote:
{remote}
    flood: [192.0.2.2]
"""


def traffic(scenario: str, flows: int, path: str) -> str:
    from . import gen

    if scenario == "l3":
        tmpl = f'Ether(src="{GEN_MAC}",dst="{GW_MAC}")/IP(src="172.16.0.1",dst="10.0.0.0")/UDP(sport=1024,dport=5000)'
        vary = {"ip.dst": f"10.0.0.0-{_ip('10.0.0.0', N_ROUTES - 1)}", "udp.sport": "1024-65535"}
    elif scenario == "snat":
        tmpl = f'Ether(src="{GEN_MAC}",dst="{GW_MAC}")/IP(src="10.0.0.11",dst="198.51.100.1")/UDP(sport=1024,dport=53)'
        vary = {"udp.sport": "1024-65535", "ip.dst": "198.51.100.1-198.51.100.250"}
    elif scenario == "vxlan":
        tmpl = (f'Ether(src="{GEN_MAC}",dst="02:00:00:01:00:00")/IP(src="10.0.0.11",dst="10.0.0.100")'
                f'/UDP(sport=1024,dport=5000)')
        vary = {"eth.dst": f"02:00:00:01:00:00-02:00:00:01:{(VXLAN_ENDPOINTS - 1) >> 8:02x}:{(VXLAN_ENDPOINTS - 1) & 255:02x}",
                "udp.sport": "1024-65535", "udp.dport": "5000-5003"}  # 100,000 flows need more than the ports
    else:
        raise BenchError(f"unknown live scenario {scenario}")
    gen.generate_pcap(path, tmpl, flows, flows=flows, vary=vary, size=64)
    return path


# ---- devices under test ------------------------------------------------------------------------------

class DpuRun:
    """``dpu run`` in the dut namespace."""

    def __init__(self, rig: Rig, scenario: str, workers: int = 1, io: str = "afpacket",
                 burst: Optional[int] = None) -> None:
        self.ctl = os.path.join(rig.tmp, f"dpu-{len(os.listdir(rig.tmp))}.ctl")
        args = ["--port", "in0=in0", "--port", "out0=out0", "--ctl", self.ctl, "--workers", str(workers), "--io", io]
        if burst is not None:
            args += ["--burst", str(burst)]
        if scenario == "vxlan":
            path = os.path.join(rig.tmp, "topo.yaml")
            with open(path, "w") as f:
                f.write(vxlan_topology())
            args += ["--config", path]
        else:
            path = os.path.join(rig.tmp, f"{scenario}.flows")
            with open(path, "w") as f:
                f.write("\n".join(l3_flows() if scenario == "l3" else snat_flows()) + "\n")
            args += ["--flows", path]
        self.cpus = rig.dut_pin(workers)
        self.proc = rig.spawn("dut", rig.pinned(self.cpus, sys.executable, "-m", "dpu.cli", "run", *args),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        said = []  # what it wrote before it stopped: the reason it did not start
        while True:
            line = self.proc.stderr.readline()
            if not line:
                said += self.proc.communicate()[1].splitlines()
                last = [x.strip() for x in said if x.strip()][-1:]  # its error line (after any usage text)
                raise BenchError(f"dpu run did not start: {last[0] if last else 'no output'}")
            if "dpu: info: forwarding on " in line:  # its start record, after the record's time (dpu/logs.py)
                break
            said.append(line)

    def busy(self):
        """The forwarding workers' busy and busy + idle time so far (ns, summed)."""
        from .control import call

        ws = call(self.ctl, "stats")["workers"][1:]  # worker 0 is the API's
        return sum(w["busy_ns"] for w in ws), sum(w["busy_ns"] + w["idle_ns"] for w in ws)

    def close(self) -> str:
        self.proc.send_signal(signal.SIGTERM)
        out, _ = self.proc.communicate(timeout=60)
        return out


class OvsRun:
    """Open vSwitch's userspace datapath (ovsdb-server + ovs-vswitchd, datapath_type=netdev) in the dut
    namespace, its own database and run directory, the same flows; ports of type "system" (AF_PACKET)
    or "afxdp"."""

    def __init__(self, rig: Rig, scenario: str, port_type: str = "system") -> None:
        for tool in ("ovsdb-tool", "ovsdb-server", "ovs-vswitchd", "ovs-vsctl", "ovs-ofctl"):
            if not shutil.which(tool):
                raise BenchError("Open vSwitch is not installed (apt-get install openvswitch-switch)")
        self.rig = rig
        d = self.dir = tempfile.mkdtemp(prefix="ovs-", dir=rig.tmp)
        self.env = dict(os.environ, OVS_RUNDIR=d, OVS_DBDIR=d, OVS_LOGDIR=d, OVS_SYSCONFDIR=d)
        db, sock = os.path.join(d, "conf.db"), os.path.join(d, "db.sock")
        _sh("ovsdb-tool", "create", db, "/usr/share/openvswitch/vswitch.ovsschema")
        self.procs = [rig.spawn("dut", ["ovsdb-server", db, f"--remote=punix:{sock}", f"--unixctl={d}/ovsdb.ctl",
                                        f"--log-file={d}/ovsdb.log"],
                                env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
        self._wait(lambda: os.path.exists(sock), "ovsdb-server")
        self.vsctl("--no-wait", "init")
        if rig.kernel_rx == "dut":
            # The kernel's receive work shares the PMD's CPU: let the PMD sleep when its queues
            # run light (OVS 3.1's load-based sleep), as an operator would. With the default (0,
            # never sleep) it starved the NAPI thread: live-l3 0.20 Mpps against 0.45-0.46 with
            # 100, 1,000 or 10,000 µs.
            self.vsctl("--no-wait", "set", "Open_vSwitch", ".", f"other_config:pmd-maxsleep={OVS_PMD_MAXSLEEP_US}")
        self.cpus = rig.dut_pin(1)  # one PMD thread (pmd-cpu-mask), or the main thread for system ports
        if self.cpus:
            self.vsctl("--no-wait", "set", "Open_vSwitch", ".",
                       f"other_config:pmd-cpu-mask={sum(1 << c for c in self.cpus):#x}")
        self.procs.append(rig.spawn("dut", rig.pinned(self.cpus, "ovs-vswitchd", f"unix:{sock}",
                                                      f"--unixctl={d}/vswitchd.ctl", f"--log-file={d}/vswitchd.log"),
                                    env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        self._wait(lambda: os.path.exists(f"{d}/vswitchd.ctl"), "ovs-vswitchd")
        self.vsctl("add-br", "br0", "--", "set", "bridge", "br0", "datapath_type=netdev")
        for p in ("in0", "out0"):
            if port_type == "system":
                self.vsctl("add-port", "br0", p)
            else:
                self.vsctl("add-port", "br0", p, "--", "set", "interface", p, f"type={port_type}")
        if scenario == "vxlan":
            flows = self._vxlan()
        else:
            flows = l3_flows() if scenario == "l3" else snat_flows()
        path = os.path.join(d, "flows.txt")
        with open(path, "w") as f:
            f.write("\n".join(flows) + "\n")
        _sh(*rig.exec("dut", "ovs-ofctl", "del-flows", f"unix:{d}/br0.mgmt"), env=self.env)
        _sh(*rig.exec("dut", "ovs-ofctl", "add-flows", f"unix:{d}/br0.mgmt", path), env=self.env)
        time.sleep(0.5)

    def _vxlan(self) -> List[str]:
        """br0 holds in0 and a VXLAN port; out0 sits on br-phy whose LOCAL port has the VTEP address."""
        self.vsctl("del-port", "br0", "out0")
        self.vsctl("add-br", "br-phy", "--", "set", "bridge", "br-phy", "datapath_type=netdev",
                   f"other_config:hwaddr={OUT_MAC}")
        self.vsctl("add-port", "br-phy", "out0")
        self.vsctl("add-port", "br0", "vx0", "--", "set", "interface", "vx0", "type=vxlan",
                   "options:remote_ip=flow", "options:key=flow", "options:local_ip=192.0.2.1")
        # replace, not add: br-phy (a tap device) may outlive an earlier run in this namespace
        _sh(*self.rig.exec("dut", "ip", "addr", "replace", "192.0.2.1/24", "dev", "br-phy"))
        _sh(*self.rig.exec("dut", "ip", "link", "set", "br-phy", "up"))
        self.appctl("ovs/route/add", "192.0.2.0/24", "br-phy")
        self.appctl("tnl/neigh/set", "br-phy", "192.0.2.2", NEXTHOP)  # not s0's own MAC, as for live-l3
        _sh(*self.rig.exec("dut", "ovs-ofctl", "add-flow", f"unix:{self.dir}/br-phy.mgmt", "actions=NORMAL"),
            env=self.env)
        return [f"table=0,priority=100,in_port=in0,dl_dst=02:00:00:01:{i >> 8 & 255:02x}:{i & 255:02x},"
                f"actions=set_field:0x64->tun_id,set_field:192.0.2.2->tun_dst,output:vx0"
                for i in range(VXLAN_ENDPOINTS)]

    def _wait(self, ready, what: str) -> None:
        deadline = time.monotonic() + 10
        while not ready():
            if time.monotonic() > deadline:
                raise BenchError(f"{what} did not start (logs in {self.dir})")
            time.sleep(0.05)

    def vsctl(self, *args: str) -> None:
        _sh(*self.rig.exec("dut", "ovs-vsctl", f"--db=unix:{self.dir}/db.sock", "--timeout=20", *args), env=self.env)

    def appctl(self, *args: str) -> None:
        _sh(*self.rig.exec("dut", "ovs-appctl", "-t", f"{self.dir}/vswitchd.ctl", *args), env=self.env)

    def busy(self):
        """The PMD threads' processing and processing + idle cycles so far
        (dpif-netdev/pmd-stats-show), or None when no PMD thread has polled a packet
        (ports of type system are read by the main thread). OVS counts an iteration
        that received packets as processing, one that received none as idle: the same
        share as dpu's busy time (rounds that got packets over all rounds)."""
        out = _sh(*self.rig.exec("dut", "ovs-appctl", "-t", f"{self.dir}/vswitchd.ctl",
                                 "dpif-netdev/pmd-stats-show"), env=self.env).stdout
        return pmd_cycles(out)

    def close(self) -> str:
        for p in reversed(self.procs):
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        return ""


def pmd_cycles(stats: str):
    """(processing, processing + idle) cycles summed over the "pmd thread" sections of
    `ovs-appctl dpif-netdev/pmd-stats-show`, or None if they processed nothing."""
    busy = idle = 0
    in_pmd = False
    for line in stats.splitlines():
        if not line.startswith(" "):
            in_pmd = line.startswith("pmd thread")
            continue
        m = re.match(r"\s+(idle|processing) cycles:\s*(\d+)", line)
        if in_pmd and m:
            if m.group(1) == "idle":
                idle += int(m.group(2))
            else:
                busy += int(m.group(2))
    return (busy, busy + idle) if busy else None


# ---- scenarios --------------------------------------------------------------------------------------

LIVE_SCENARIOS = {"live-l3": "l3", "live-vxlan": "vxlan", "live-snat": "snat"}


def _median(values: List[float]) -> float:
    return round(statistics.median(values), 3)


def _summary(rig: Rig, runs: List[dict], cpus: List[int]) -> dict:
    res = {"mpps": _median([r["mpps"] for r in runs]), "offered_mpps": _median([r["offered_mpps"] for r in runs]),
           "runs_mpps": [r["mpps"] for r in runs], "pinned": bool(cpus), "gen_cpus": rig.gen_cpus,
           "dut_cpus": cpus}
    busy = [r["busy_ratio"] for r in runs if r.get("busy_ratio")]
    if busy and rig.kernel_rx == "gen":  # else the kernel's receive work shares the CPU, uncounted
        # The load at the forwarded rate, and the rate it points to at full load: an
        # estimate (smaller batches at a lower rate cost more per packet), for when the
        # generator cannot offer more than the device forwards.
        res["busy_ratio"] = _median(busy)
        res["saturation_mpps_est"] = round(res["mpps"] / res["busy_ratio"], 3)
    return res


def measure(rig: Rig, duts, pcap: str, repeat: int) -> dict:
    """Each device under test in `duts` ((key, start) pairs; start() returns a running
    device) measured `repeat` times in turns: every turn starts each device, measures it
    once and stops it, the order reversed every other turn. Whatever drifts during the
    run (the machine's speed, the generator's rate) then falls on every device alike,
    and their ratios compare them on the same rig and traffic. Returns {key: summary},
    or {key: the error} for a device that failed to start in any turn (its other turns'
    figures are not reported: half a series would not compare)."""
    runs = {key: [] for key, _ in duts}
    cpus = {}
    failed = {}
    for turn in range(repeat):
        for key, start in (duts if turn % 2 == 0 else duts[::-1]):
            if key in failed:
                continue
            try:
                dut = start()
            except (BenchError, DpuError) as e:
                failed[key] = e
                continue
            try:
                runs[key].append(rig.forwarded(pcap, busy=getattr(dut, "busy", None)))
                cpus[key] = dut.cpus
            finally:
                dut.close()
    return {key: failed[key] if key in failed else _summary(rig, runs[key], cpus[key]) for key, _ in duts}


def run_live(name: str, repeat: int = 3, workers=(1, 2), io=("afpacket",), flows=FLOW_COUNTS, ovs: bool = False,
             burst: Optional[int] = None, kernel_rx: str = "gen"):
    """One result per (flows, io, workers) for dpu (and per (flows, port type) for OVS):
    dicts with the JSON fields of ``dpu bench``, or with "error" for a device that could
    not start (an I/O backend this machine lacks). dpu takes `burst` frames a batch
    (``dpu run --burst``; None: its default). All of a flow count's devices are measured
    on one rig, in turns (measure())."""
    scenario = LIVE_SCENARIOS[name]
    if kernel_rx == "dut" and "afpacket" in io:
        # dpu turns GRO off on an AF_PACKET port (frames as on the wire), and a veth without
        # GRO or XDP has no NAPI: its receive work would run on the generator's CPU again.
        raise BenchError("kernel_rx dut applies to AF_XDP devices only (--io afxdp)")
    out = []
    with Rig(queues=max(workers), kernel_rx=kernel_rx) as rig:
        for n_flows in flows:
            pcap = traffic(scenario, n_flows, os.path.join(rig.tmp, f"{scenario}-{n_flows}.pcap"))
            ceiling = rig.raw_ceiling(pcap)

            def start_dpu(kind: str, w: int):
                rig.set_queues(w)
                return DpuRun(rig, scenario, w, kind, burst)

            def start_ovs(ptype: str):
                rig.set_queues(1)  # OVS reads one queue a port (options:n_rxq=1)
                return OvsRun(rig, scenario, ptype)

            duts = [(("dpu", kind, w), lambda kind=kind, w=w: start_dpu(kind, w)) for kind in io for w in workers]
            if ovs:
                duts += [(("ovs", ptype, 1), lambda ptype=ptype: start_ovs(ptype)) for ptype in (("system", "afxdp") if kernel_rx == "gen" else ("afxdp",))]
            results = measure(rig, duts, pcap, repeat)
            for (dut, kind, w), r in results.items():
                io_name = "afpacket" if kind == "system" else kind
                if isinstance(r, Exception):
                    out.append({"scenario": name, "dut": dut, "io": io_name, "flows": n_flows, "error": str(r)})
                    continue
                res = {"scenario": name, "dut": dut, "io": io_name, "workers": w, "flows": n_flows}
                if dut == "dpu":
                    res["burst"] = burst or _core.DEFAULT_BURST
                res.update({"packet_size": 64, "repeat": repeat, "raw_ceiling_mpps": ceiling["mpps"],
                            "kernel_rx": kernel_rx})
                if dut == "ovs" and kernel_rx == "dut":
                    res["pmd_maxsleep_us"] = OVS_PMD_MAXSLEEP_US
                if dut == "dpu":
                    res["ceiling_ratio"] = round(r["mpps"] / ceiling["mpps"], 3) if ceiling["mpps"] else None
                out.append({**res, **r})
    return out


def hold(name: str, io: str = "afpacket", workers: int = 1, ovs: bool = True, kernel_rx: str = "gen",
         burst: Optional[int] = None, ready=None) -> None:
    """What run_live measures, set up and left running until a signal ends the process (which
    removes it all: dpu.cleanup): the rig, ``dpu run`` (`io`, `workers`) and, with `ovs`, Open
    vSwitch's daemons on the same ports (ports of type system). `ready(info)` is called once
    they run, with where everything is: the namespaces, the temporary directory and the
    processes' ids. For looking at a rig by hand, and for testing that a signal leaves
    nothing behind."""
    scenario = LIVE_SCENARIOS[name]
    with Rig(queues=workers, kernel_rx=kernel_rx) as rig:
        duts = [DpuRun(rig, scenario, workers, io, burst)]
        if ovs:
            duts.append(OvsRun(rig, scenario, "system"))
        procs = [d.proc for d in duts if isinstance(d, DpuRun)] + [p for d in duts if isinstance(d, OvsRun)
                                                                   for p in d.procs]
        if ready:
            ready({"scenario": name, "namespaces": sorted(rig.ns.values()), "tmp": rig.tmp,
                   "pids": [p.pid for p in procs]})
        while True:
            signal.pause()


def render(res: dict) -> str:
    if "error" in res:
        return f"{res['scenario']:<11} {res['dut']:<4} {res['io']:<8} flows={res['flows']}: {res['error']}"
    return (f"{res['scenario']:<11} {res['dut']:<4} {res['io']:<8} workers={res['workers']} flows={res['flows']:<6} "
            f"{res['mpps']:6.3f} Mpps forwarded (offered {res['offered_mpps']:.3f}, raw ceiling "
            f"{res['raw_ceiling_mpps']:.3f}; "
            + (f"cpus {','.join(map(str, res['dut_cpus']))}, generator on {','.join(map(str, res['gen_cpus']))}"
               + (", kernel rx on the device's cpus" if res.get("kernel_rx") == "dut" else "")
               + (f", pmd-maxsleep {res['pmd_maxsleep_us']} µs)" if res.get("pmd_maxsleep_us") else ")")
               if res.get("pinned") else "unpinned)")
            + (f"; {'workers' if res['dut'] == 'dpu' else 'PMD'} {res['busy_ratio']:.0%} busy: about "
               f"{res['saturation_mpps_est']:.3f} Mpps at full load"
               if res.get("busy_ratio") else ""))


__all__ = ["LIVE_SCENARIOS", "Rig", "DpuRun", "OvsRun", "run_live", "hold", "render", "BenchError"]

