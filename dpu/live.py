"""``dpu run``: the dataplane attached to Linux interfaces.

An :class:`Instance` is everything a running dpu is: the :class:`Dataplane`
(one API worker plus ``workers`` forwarding workers), the native live workers
(worker threads over AF_PACKET or AF_XDP queues, no GIL), the control socket
(:mod:`dpu.control`), the Prometheus endpoint (:mod:`dpu.metrics`) and the
next-hop resolver (:mod:`dpu.arp`).

``open()`` does everything that can fail (topology, ports, interfaces,
permissions, the socket and the metrics address) before any packet moves:
a problem is one line naming it, and nothing is left behind. ``start()``
starts the workers; ``stop()`` stops them and removes the socket.

Changes made while running (flows, reloads, resolved next hops) are
serialised by one lock and each is one atomic transaction: the workers
finish the batch in hand and continue with the new tables.
"""
from __future__ import annotations

import copy
import errno
import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from . import _core, logs
from .control import check_ctl_path
from .dataplane import Dataplane, read_flows_file
from .errors import DpuError, LiveError
from .service import Notifier, PidFile, Signals, check_fd_limit, fd_need, raise_fd_limit, signal_name

log = logging.getLogger("dpu.live")

DEFAULT_CTL = "/run/dpu/dpu.ctl"
IO_BACKENDS = _core.IO_BACKENDS  # the backends this build has (the binding's list)
CAP_NET_RAW = 13
IFF_UP = 0x1


@dataclass
class LiveOptions:
    ports: List[Tuple[str, str]]                 # (port name, interface), as given
    config: Optional[str] = None                 # topology file
    flows: Optional[str] = None                  # extra flows file
    workers: int = 1
    io: str = "afpacket"
    ctl: Optional[str] = DEFAULT_CTL             # None: no control socket
    metrics: Optional[str] = None                # "host:port"
    burst: int = _core.DEFAULT_BURST
    arp_refresh_s: float = 30.0
    drops_pcap: Optional[str] = None             # every dropped packet to this pcapng file
    pidfile: Optional[str] = None                # this process's id, written once it forwards


def parse_port_args(values: Sequence[str]) -> List[Tuple[str, str]]:
    """``NAME=IFACE`` pairs; a port or an interface given twice is an error."""
    out: List[Tuple[str, str]] = []
    names: Dict[str, str] = {}
    ifaces: Dict[str, str] = {}
    for v in values:
        if "=" not in v or not v.split("=", 1)[0] or not v.split("=", 1)[1]:
            raise LiveError(f"--port takes NAME=INTERFACE, got '{v}'")
        name, ifname = v.split("=", 1)
        if name in names:
            raise LiveError(f"port {name} is given twice (--port {name}={names[name]} and --port {v})")
        if ifname in ifaces:
            raise LiveError(f"interface {ifname} is given twice (ports {ifaces[ifname]} and {name})")
        if len(ifname) > 15 or "/" in ifname or ifname in (".", ".."):
            raise LiveError(f"--port {v}: '{ifname}' is not an interface name")
        names[name] = ifname
        ifaces[ifname] = name
        out.append((name, ifname))
    if not out:
        raise LiveError("dpu run needs at least one --port NAME=INTERFACE")
    return out


def _has_cap(bit: int) -> bool:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> bit & 1)
    except OSError:
        pass
    return os.geteuid() == 0


def check_interface(name: str, ifname: str) -> Optional[str]:
    """Raises LiveError for a missing or down interface; returns a warning
    (no carrier) or None."""
    base = f"/sys/class/net/{ifname}"
    if not os.path.isdir(base):
        raise LiveError(f"port {name}: no interface named {ifname}")
    try:
        with open(f"{base}/flags") as f:
            flags = int(f.read().strip(), 16)
    except (OSError, ValueError):
        flags = IFF_UP
    if not flags & IFF_UP:
        raise LiveError(f"port {name}: interface {ifname} is down (ip link set {ifname} up)")
    try:
        with open(f"{base}/operstate") as f:
            oper = f.read().strip()
    except OSError:
        oper = "unknown"
    if oper in ("down", "lowerlayerdown"):
        return f"port {name}: interface {ifname} has no carrier yet ({oper}); traffic starts when it has"
    return None


def interface_queues(ifname: str) -> Optional[int]:
    """Queues an interface can both receive and transmit on (sysfs), or None when unknown."""
    try:
        names = os.listdir(f"/sys/class/net/{ifname}/queues")
    except OSError:
        return None
    return min(sum(n.startswith("rx-") for n in names), sum(n.startswith("tx-") for n in names))


def queue_count(opts: "LiveOptions") -> int:
    """The queues dpu run opens: one per worker and interface; AF_XDP, every receive queue
    of an interface, at least one per worker (ports/backend.h, IoBackend::queues)."""
    if opts.io != "afxdp":
        return opts.workers * len(opts.ports)
    return sum(max(opts.workers, interface_queues(ifname) or 0) for _, ifname in opts.ports)


def check_afxdp_queues(name: str, ifname: str, workers: int) -> Optional[str]:
    """AF_XDP binds every receive queue, queue q to worker q mod N: fewer queues than workers
    is an error (a worker would have nothing of the interface); more is fine."""
    n = interface_queues(ifname)
    fix = f"ethtool -L {ifname} combined {workers} (veth: rx {workers} tx {workers}, and the same on its peer)"
    if n is not None and n < workers:
        raise LiveError(f"port {name}: interface {ifname} has {n} queue(s), --workers {workers} needs {workers} "
                        f"with --io afxdp (one queue per worker): {fix}")
    return None


def parse_metrics_addr(text: str) -> Tuple[str, int]:
    """``[host:]port`` (host defaults to 127.0.0.1; ``[v6]:port`` for IPv6)."""
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = "127.0.0.1", text
    host = host.strip("[]") or "127.0.0.1"
    try:
        p = int(port)
    except ValueError:
        raise LiveError(f"--metrics takes HOST:PORT, got '{text}'") from None
    if not 1 <= p <= 65535:
        raise LiveError(f"--metrics: port {p} is out of range (1-65535)")
    return host, p


class Instance:
    """A running dpu (see the module docstring)."""

    def __init__(self, opts: LiveOptions) -> None:
        self.opts = opts
        self.dp: Optional[Dataplane] = None
        self.live = None
        self.lock = threading.RLock()          # one change at a time
        self.topology = None                   # as read from the file, next hops unresolved
        self.resolved: Dict[str, str] = {}     # "uplink"/"internet" -> MAC the resolver found
        self.control = None
        self.metrics = None
        self.resolver = None
        self.evpn = None                       # dpu.evpn.EvpnService, with an evpn: section
        self.warnings: List[str] = []
        self.started_at = 0.0
        self.attached: Dict[str, str] = {}     # port name -> interface
        self.signals: Optional[Signals] = None   # trap_signals(): SIGHUP reloads, the others stop
        self.notifier = Notifier({})               # run() gives it NOTIFY_SOCKET
        self._offloads_told: set = set()       # (interface, what) already logged

    # ---- before anything runs ------------------------------------------------------
    def open(self) -> None:
        o = self.opts
        if o.io not in IO_BACKENDS:
            raise LiveError(f"--io must be one of {', '.join(IO_BACKENDS)}, got '{o.io}'")
        if not 1 <= o.workers <= 63:
            raise LiveError(f"--workers must be 1..63, got {o.workers}")
        if not o.config and not o.flows:
            raise LiveError("dpu run needs --config and/or --flows")
        dp = Dataplane(workers=o.workers + 1)  # worker 0 serves API calls; 1..N forward
        if o.config:
            from .topology import load_topology

            self.topology = load_topology(o.config)
            dp.load_topology(self.topology, flows_file=self.opts.flows)
            known = set(dp.ports)
            for name, ifname in o.ports:
                if name not in known:
                    raise LiveError(f"--port {name}={ifname}: the topology has no port {name} "
                                    f"(its ports: {', '.join(sorted(p for p in known if p != 'vxlan0'))})")
        else:
            with dp.transaction() as t:
                for name, _ in o.ports:
                    t.add_port(name)
            dp.load_flows(o.flows)
        for name, ifname in o.ports:
            w = check_interface(name, ifname)
            if w:
                self.warnings.append(w)
            if o.io == "afxdp":
                w = check_afxdp_queues(name, ifname, o.workers)
                if w:
                    self.warnings.append(w)
        if o.ctl:
            check_ctl_path(os.fspath(o.ctl))
        if o.drops_pcap:
            check_drops_path(os.fspath(o.drops_pcap), [("topology file", o.config), ("flows file", o.flows)])
        if not _has_cap(CAP_NET_RAW):
            raise LiveError("dpu run needs root or CAP_NET_RAW to open its interfaces")
        for p in dp.port_info():
            if not p.get("tunnel") and p["name"] not in dict(o.ports):
                self.warnings.append(f"port {p['name']} has no interface: what it would send is counted as tx_dropped")
        self.dp = dp
        self.attached = dict(o.ports)
        ports = [(dp.port_number(name), ifname) for name, ifname in o.ports]
        self.live = dp._core.live(ports, io=o.io, burst=o.burst, first_worker=1,
                                    drops_pcap=os.fspath(o.drops_pcap) if o.drops_pcap else "")
        try:
            if o.ctl:
                from .control import ControlServer

                self.control = ControlServer(o.ctl, self)
            if o.metrics:
                from .metrics import MetricsServer

                self.metrics = MetricsServer(*parse_metrics_addr(o.metrics), self)
            from .arp import Resolver

            self.resolver = Resolver.for_topology(self)
            if self.topology is not None and self.topology.evpn is not None:
                self.evpn = self._evpn_service()
        except Exception:
            self.close()
            raise

    def _evpn_service(self):
        from .evpn import EvpnService

        uplink = self.topology.uplink.port
        ifname = self.attached.get(uplink)
        if ifname is None:
            raise LiveError(f"evpn: the uplink port {uplink} needs an interface (--port {uplink}=IFNAME): "
                            "its address is the VTEP FRR advertises")
        return EvpnService(self.dp, self.topology, ifname, os.fspath(self.opts.ctl) if self.opts.ctl else None)

    # ---- running --------------------------------------------------------------------
    def start(self) -> None:
        self.live.start()  # opens every queue first: an error leaves nothing running
        if self.evpn is not None:
            try:
                self.evpn.start()
            except Exception:
                self.live.stop()
                self.close()
                raise
        self.started_at = time.monotonic()
        if self.control:
            self.control.start()
        if self.metrics:
            self.metrics.start()
        if self.resolver:
            self.resolver.start()

    def stop(self) -> None:
        if self.live is not None and self.live.running:
            self.live.stop()
        self.close()

    def close(self) -> None:
        for part in (self.resolver, self.control, self.metrics, self.evpn):
            if part is not None:
                part.close()
        self.resolver = self.control = self.metrics = self.evpn = None

    def trap_signals(self) -> None:
        """From now on SIGHUP asks for a reload and SIGINT, SIGTERM and every other signal
        that would end the process (dpu.service.STOP_SIGNALS) for a stop, which wait()
        acts on, instead of killing the process. run() calls it before open(): a signal
        that comes while dpu starts, or as soon as it says it forwards, still ends cleanly."""
        if self.signals is None:
            self.signals = Signals()
        self.signals.install()

    @property
    def stop_signal(self) -> Optional[int]:
        """The stop signal received, if any."""
        return self.signals.stop if self.signals is not None else None

    def wait(self) -> int:
        """Forwards until a stop signal; reloads on SIGHUP meanwhile. Returns the signal number.
        The handlers stay until release_signals(): a second signal while dpu stops is no
        more than the first."""
        self.trap_signals()
        while self.signals.stop is None:
            self.signals.wait(0.5)
            if self.signals.take_reload() and self.signals.stop is None:
                self.reload_on_signal()
            self.tell_core()
            self.tell_offloads()
            if self.evpn is not None:
                self.evpn.housekeeping()
        self.notifier.stopping(f"stopping ({signal_name(self.signals.stop)})")
        return self.signals.stop

    def reload_on_signal(self) -> None:
        """SIGHUP: what `dpu reload` does, said on stderr; a refused reload leaves the running
        tables as they were and dpu running. The service manager hears RELOADING=1, then
        READY=1 when it is done, either way."""
        self.notifier.reloading()
        try:
            res = self.reload()
        except DpuError as e:
            log.error("SIGHUP: reload refused, the running tables stay: %s: %s", type(e).__name__, e)
        else:
            text, warnings = reload_text(res)
            log.info("SIGHUP: %s", text)
            for w in warnings:
                log.warning("%s", w)
        self.notifier.ready(self.status_text())

    def tell_core(self) -> None:
        """Logs what the native core said since (an interface created again, an AF_XDP queue's
        mode): it queues records instead of writing to stderr (native/src/core_log.h)."""
        logs.log_core(_core.take_log())

    def tell_offloads(self) -> None:
        """One line per interface and kind of frame a sender's offloads left for dpu that it
        cannot finish (the fast path never logs; the workers count, this reads):
        - AF_PACKET: super-frames of a kind dpu cannot cut (offload_unsupported drops);
        - AF_XDP on a virtual interface: VXLAN frames with unfinished checksums
          (vxlan_bad_checksum), which a Linux sender behind a veth leaves to offload and XDP
          sees before the kernel would finish them (docs/live.md, "Offloads").
        Each names what to turn off on the device that sends them."""

        def tell(ifname: str, what: str, text: str) -> None:
            if (ifname, what) not in self._offloads_told:
                self._offloads_told.add((ifname, what))
                log.warning("interface %s %s", ifname, text, extra={"interface": ifname})

        for q in self.interface_stats():
            for what, features in q.get("unsupported_offloads", ()):
                off = " ".join(f"{f} off" for f in features.split())
                tell(q["ifname"], what, f"receives {what}, which dpu cannot cut (dropped: offload_unsupported); "
                     f"on the device that sends them (a veth's peer): ethtool -K DEV {off}")
        if self.opts.io != "afxdp":
            return
        ports = None
        for name, ifname in self.attached.items():
            if (ifname, "xdp") in self._offloads_told or not os.path.exists(f"/sys/devices/virtual/net/{ifname}"):
                continue
            ports = ports if ports is not None else self.dp.stats()["ports"]
            if ports.get(name, {}).get("drops", {}).get("vxlan_bad_checksum"):
                tell(ifname, "xdp", "(AF_XDP) receives VXLAN frames with unfinished checksums (dropped: "
                     "vxlan_bad_checksum): XDP sees a frame before the kernel finishes what a sender behind "
                     "this virtual interface left to offload; on that device (a veth's peer): ethtool -K DEV tx off "
                     "(or --io afpacket, which finishes them)")

    def release_signals(self) -> None:
        if self.signals is not None:
            self.signals.close()
            self.signals = None

    # ---- changes while running --------------------------------------------------------
    def effective_topology(self):
        """The file's topology with the next hops the resolver has found."""
        topo = copy.copy(self.topology)
        if "uplink" in self.resolved and topo.uplink.nexthop_mac is None:
            topo.uplink = copy.copy(topo.uplink)
            topo.uplink.nexthop_mac = self.resolved["uplink"]
        if "internet" in self.resolved and topo.internet is not None and topo.internet.nexthop_mac is None:
            topo.internet = copy.copy(topo.internet)
            topo.internet.nexthop_mac = self.resolved["internet"]
        return topo

    def reload(self) -> dict:
        """Reads the topology (and extra flows) file again and applies it in one
        transaction; with flows alone, replaces every flow and group with the file's."""
        with self.lock:
            if self.opts.config:
                from .topology import load_topology

                topo = load_topology(self.opts.config)
                attached = set(self.attached)
                old = self.topology
                if (old.evpn is None) != (topo.evpn is None):
                    raise LiveError("reload: the evpn: section was " + ("added" if old.evpn is None else "removed")
                                    + "; starting or stopping the fabric needs a restart of dpu run")
                if old.evpn is not None and (old.evpn.frr, old.evpn.frr_dir) != (topo.evpn.frr, topo.evpn.frr_dir):
                    raise LiveError(f"reload: evpn.frr ({old.evpn.frr}, {old.evpn.frr_dir}) changed to "
                                    f"({topo.evpn.frr}, {topo.evpn.frr_dir}); who runs FRR changes only with a "
                                    "restart of dpu run")
                self.topology = topo
                try:
                    res = self.dp.load_topology(self.effective_topology(), flows_file=self.opts.flows)
                except DpuError:
                    self.topology = old
                    raise
                missing = sorted(attached - set(self.dp.ports))
                if self.resolver:
                    self.resolver.retarget()
                if self.evpn is not None:
                    self.evpn.reload(topo)
                if any(t.security for t in topo.tenants.values()):
                    # a worker may still commit a connection by the old rules in the batch it had
                    # begun: judge the table once more when every batch has seen the new ones
                    timer = threading.Timer(0.25, self._cut_again)
                    timer.daemon = True
                    timer.start()
                out = dict(res)
                if missing:
                    out["detached"] = missing
                return out
            t = self.dp.transaction()
            t.del_flows("")
            t.del_groups("")
            t.add_numbered(read_flows_file(self.opts.flows), os.fspath(self.opts.flows))
            return t.commit()

    def _cut_again(self) -> None:
        from .topology.security_flows import cut_connections

        with self.lock:
            if self.dp is not None:
                cut_connections(self.dp, self.topology)

    def set_resolved(self, which: str, mac: Optional[str]) -> None:
        """The resolver found (or lost) a next hop: recompile with it."""
        with self.lock:
            if self.resolved.get(which) == mac:
                return
            if mac is None:
                self.resolved.pop(which, None)
            else:
                self.resolved[which] = mac
            self.dp.load_topology(self.effective_topology(), flows_file=self.opts.flows)

    # ---- what is running ----------------------------------------------------------------
    def trace(self, data: bytes, in_port: str):
        """dpu trace --ctl: the dataplane's trace, naming the learned entry of each flow the
        fabric installed."""
        tr = self.dp.trace(data, in_port)
        evpn = self.evpn
        return evpn.mirror.annotate(tr) if evpn is not None else tr

    def evpn_view(self) -> dict:
        """dpu evpn --ctl: the fabric as configured, learned and in force."""
        if self.evpn is not None:
            return self.evpn.view()
        from .mirror import evpn_view

        if self.topology is None:
            return {"evpn": None, "tenants": {}}
        return evpn_view(self.topology)

    def show(self) -> dict:
        ports = []
        for p in self.dp.port_info():
            ports.append({"name": p["name"], "ofport": p["ofport"], "interface": self.attached.get(p["name"]),
                          "tunnel": bool(p.get("tunnel"))})
        return {
            "pid": os.getpid(),
            "io": self.opts.io,
            "workers": self.opts.workers,
            "uptime": round(time.monotonic() - self.started_at, 3) if self.started_at else 0.0,
            "config": self.opts.config,
            "flows": self.opts.flows,
            "ports": ports,
            "nexthops": self.resolver.status() if self.resolver else {},
        }

    def interface_stats(self) -> List[dict]:
        return list(self.live.queue_stats()) if self.live is not None else []

    def status_text(self) -> str:
        """One line: what it forwards on (dpu run's announcement, systemd's STATUS=)."""
        names = ", ".join(f"{n}={i}" for n, i in self.opts.ports)
        return f"forwarding on {names} with {self.opts.workers} worker(s), {self.opts.io}"

    def final_report(self) -> str:
        from .report import counter_tables, tenant_zones

        st = self.dp.stats()
        lines = [counter_tables(st, zones=tenant_zones(self.dp))]
        lines.append("\nInterfaces:")
        from .report import interfaces_table

        lines.append(interfaces_table(self.interface_stats(), {v: k for k, v in self.dp.ports.items()}))
        secs = time.monotonic() - self.started_at if self.started_at else 0.0
        p = st["workers_total"]
        from .report import rate_text

        rate = rate_text(p["packets"] / secs) if secs > 0 else "-"
        lines.append(f"\nRan {secs:.1f}s with {self.opts.workers} worker(s) on {self.opts.io}: "
                     f"{p['packets']:,} packets ({rate} average)")
        if self.opts.drops_pcap:
            try:
                self.live.check_drops()
                lines.append(f"drops: {self.live.drops_written:,} packets written to {self.opts.drops_pcap}")
            except DpuError as e:
                lines.append(f"drops: {e}")
        return "\n".join(lines)


def reload_text(res: dict) -> Tuple[str, List[str]]:
    """What a reload did, as `dpu reload` and SIGHUP say it: a line and the warnings."""
    cut = f", {res['connections_cut']} connections cut (security groups)" if "connections_cut" in res else ""
    text = (f"reloaded: {res.get('flows_added', 0)} flows added, {res.get('flows_deleted', 0)} deleted, "
            f"version {res.get('version')}{cut}")
    return text, [f"port {name} is gone from the topology; its interface no longer forwards"
                  for name in res.get("detached", [])]


def run(opts: LiveOptions, out=None) -> int:
    """``dpu run``: open, start, forward until a stop signal (reloading on SIGHUP), stop,
    print the counters. The signal handlers are in place before anything is made, and stay
    until everything is undone (docs/live.md, "Signals")."""
    import sys

    out = out or sys.stdout
    logs.setup(keep=True)  # as the command line chose it (dpu.cli), else DPU_LOG's level, as text
    check_fd_limit(*fd_need(queue_count(opts), len(opts.ports) if opts.io == "afxdp" else 0, bool(opts.ctl),
                            bool(opts.metrics)))
    pidfile = PidFile(os.fspath(opts.pidfile)) if opts.pidfile else None
    if pidfile:
        check_distinct_outputs(opts)
        pidfile.check()
    inst = Instance(opts)
    inst.trap_signals()
    try:
        inst.notifier = Notifier()
        inst.open()
        for w in inst.warnings:
            log.warning("%s", w)
        try:
            if inst.stop_signal is None:  # else: stopped while it started; nothing to undo but open()'s
                start_and_announce(inst, pidfile)
            inst.wait()
        finally:
            inst.stop()
            inst.tell_core()
            if pidfile:
                pidfile.remove()
        print(inst.final_report(), file=out, flush=True)
    finally:
        inst.notifier.close()
        inst.release_signals()
    return 0


def start_and_announce(inst: Instance, pidfile: Optional[PidFile]) -> None:
    """The workers started, then the pidfile, the line on stderr and READY=1: whoever
    waits for any of them finds dpu forwarding."""
    try:
        inst.start()
    except DpuError as e:
        raise LiveError(str(e)) from None
    inst.tell_core()  # what opening the queues said, before the line that says dpu forwards
    if pidfile:
        pidfile.write()
    extra = []
    if inst.control:
        extra.append(f"control {inst.opts.ctl}")
    if inst.metrics:
        extra.append(f"metrics http://{inst.metrics.address}/metrics")
    opts = inst.opts
    fields = {"ports": dict(opts.ports), "workers": opts.workers, "io": opts.io,
              "ctl": opts.ctl if inst.control else None, "metrics": inst.metrics.address if inst.metrics else None}
    log.info("%s%s (SIGINT or SIGTERM stops, SIGHUP reloads)", inst.status_text(),
             f"; {', '.join(extra)}" if extra else "", extra=fields)
    inst.notifier.ready(inst.status_text())


def check_distinct_outputs(opts: LiveOptions) -> None:
    """The pidfile is none of the files dpu reads or writes."""
    mine = os.path.realpath(os.fspath(opts.pidfile))
    for what, p in (("--config", opts.config), ("--flows", opts.flows), ("--drops-pcap", opts.drops_pcap),
                    ("--ctl", opts.ctl)):
        if p and os.path.realpath(os.fspath(p)) == mine:
            raise LiveError(f"--pidfile {opts.pidfile}: is the file {what} names too (choose another --pidfile)")


def check_drops_path(path: str, inputs: Sequence[Tuple[str, Optional[str]]] = ()) -> None:
    """A drops file dpu can create, checked before anything starts (the file
    itself is created when the workers start), and that is none of `inputs`
    ((what, path): the topology, the flows file), which writing it would destroy."""
    given = [(what, p) for what, p in inputs if p]
    hit = _core.find_overwrite([os.fsencode(path)], [os.fsencode(p) for _, p in given])  # the core decides
    if hit is not None:
        what, p = given[hit[1]]
        raise LiveError(f"{path}: writing the drops file would destroy the {what} {p}, an input "
                        "(choose another --drops-pcap)")
    parent = os.path.dirname(os.path.abspath(path))
    err = 0
    if os.path.isdir(path):
        err = errno.EISDIR
    elif not os.path.isdir(parent):
        err = errno.ENOENT
    elif not os.access(parent, os.W_OK | os.X_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        err = errno.EACCES
    if err:
        raise LiveError(f"{path}: cannot write the drops file: {os.strerror(err)}")


__all__ = ["DEFAULT_CTL", "Instance", "LiveOptions", "parse_port_args", "raise_fd_limit", "run"]
