"""Prometheus exposition for a running dpu (``dpu run --metrics HOST:PORT``).

A collector reads the counters at scrape time, without taking any worker's
lock (``Dataplane.stats(sync=False)``): a scrape never stalls forwarding.
Counters are ``_total``; label names follow the objects (port, interface,
tenant, reason, zone, worker, cache, table).

  dpu_port_{rx,tx}_{packets,bytes}_total{port}, dpu_port_dropped_total{port},
  dpu_port_tx_dropped_total{port}, dpu_port_rx_{truncated,malformed,unknown}_total{port},
  dpu_port_drops_total{port,reason}
  dpu_tenant_{rx,tx}_{packets,bytes}_total{tenant}, dpu_tenant_drops_total{tenant,reason}
  dpu_drops_total{reason}
  dpu_cache_hits_total{cache="emc"|"megaflow"}, dpu_cache_misses_total (upcalls), dpu_megaflows
  dpu_table_lookups_total{table}, dpu_table_matches_total{table}
  dpu_conntrack_connections{zone}, dpu_conntrack_connections_all, dpu_nat_mappings
  dpu_worker_packets_total{worker}, dpu_worker_batches_total{worker},
  dpu_worker_{busy,idle}_seconds_total{worker}, dpu_worker_busy_ratio{worker},
  dpu_worker_packets_per_batch{worker}
  dpu_interface_{rx_ring_drops,rx_too_long,tx_refused,link_errors}_total{port,interface}
  dpu_nexthop_resolved{nexthop,ip}
  dpu_security_group_rule_hits_total{tenant,group,direction,rule},
  dpu_security_group_denied_total{tenant,port,direction}

  dpu_build_info{version,isa,backends} (always 1)
  process_start_time_seconds, process_cpu_seconds_total, process_resident_memory_bytes,
  process_open_fds, ... (prometheus_client's ProcessCollector, as every Prometheus client names them)

Workers are numbered as the dataplane numbers them: worker 0 serves API calls
(trace, control), 1..N forward. A scrape changes nothing, so any number of
scrapers see the same values: busy_ratio and packets_per_batch are over the
last LOAD_WINDOW_S (10 s) of samples :class:`WorkerLoad` takes every second on a
thread of its own, whoever scrapes; a ratio over any other window is the
consumer's to take from the monotonic counters, e.g.
``rate(dpu_worker_busy_seconds_total[1m]) / (rate(dpu_worker_busy_seconds_total[1m])
+ rate(dpu_worker_idle_seconds_total[1m]))``.

The HTTP endpoint (:class:`MetricsServer`) serves prometheus_client's own WSGI
application (what a scraper or promtool sees is prometheus_client's: formats,
content negotiation, gzip), but through a :class:`dpu.serving.Listener` with
:data:`METRICS_LIMITS` instead of prometheus_client's unbounded threading
server: at most 16 clients at once (more wait in the listen backlog), a
request complete within 5 s however slowly it comes, 64 KB of request at
most, the answer taken within 10 s.
"""
from __future__ import annotations

import collections
import io
import logging
import socket
import threading
from http.server import BaseHTTPRequestHandler
from typing import Dict, Iterator, Optional, Tuple
from urllib.parse import unquote

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import CollectorRegistry

from . import _core
from .errors import LiveError
from .serving import Budget, DeadlineReader, Limits, Listener, OverBudget

log = logging.getLogger("dpu.metrics")

MAX_HTTP_REQUEST = 64 << 10  # bytes: request line and headers (a scrape sends a few hundred)
METRICS_LIMITS = Limits(clients=16, request_timeout=5.0, send_timeout=10.0, max_request=MAX_HTTP_REQUEST,
                        max_buffered=16 * MAX_HTTP_REQUEST)
BACKLOG = 64

PORT_COUNTERS = ("rx_packets", "rx_bytes", "tx_packets", "tx_bytes", "dropped", "tx_dropped", "rx_truncated",
                 "rx_malformed", "rx_unknown")
TENANT_COUNTERS = ("rx_packets", "rx_bytes", "tx_packets", "tx_bytes", "dropped")


LOAD_WINDOW_S = 10.0  # dpu_worker_busy_ratio and packets_per_batch: over the last 10 s
LOAD_SAMPLE_S = 1.0   # one sample of the workers' counters a second


class WorkerLoad:
    """The workers' busy share and packets per batch over a fixed window, from samples
    of their monotonic counters (busy and idle ns, packets, batches) that its own thread
    takes every ``every`` seconds: scrapes only read them, so a second scraper or a curl
    changes nothing. Until the window has filled, the share is since the first sample."""

    def __init__(self, dp, window: float = LOAD_WINDOW_S, every: float = LOAD_SAMPLE_S) -> None:
        self.dp, self.every = dp, every
        self._samples: collections.deque = collections.deque(maxlen=max(2, round(window / every) + 1))
        self._mu = threading.Lock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self.sample()

    def sample(self) -> None:
        cur = [(w["busy_ns"], w["idle_ns"], w["packets"], w["batches"]) for w in self.dp._core.stats()["workers"]]
        with self._mu:
            self._samples.append(cur)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="dpu-worker-load", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            try:
                self.sample()
            except Exception as e:  # noqa: BLE001 - a failed sample is a log line; the gauges keep the last
                log.debug("metrics: sampling the workers' load failed: %s: %s", type(e).__name__, e)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def ratios(self) -> Dict[int, Tuple[float, float]]:
        """worker -> (busy / (busy + idle), packets / batches) between the window's oldest
        and newest samples (0.0 where nothing moved)."""
        with self._mu:
            old, new = self._samples[0], self._samples[-1]
        out = {}
        for i, cur in enumerate(new):
            prev = old[i] if i < len(old) else (0, 0, 0, 0)
            db, di, dpk, dbt = (a - b for a, b in zip(cur, prev))
            out[i] = (db / (db + di) if db + di > 0 else 0.0, dpk / dbt if dbt > 0 else 0.0)
        return out


def build_info() -> Tuple[str, str, str]:
    """(version, the ISA the core was compiled for, the live I/O backends it has)."""
    from . import __version__

    return __version__, getattr(_core, "BUILD_ISA", "unknown"), ",".join(_core.IO_BACKENDS)


class Collector:
    def __init__(self, inst, load: Optional[WorkerLoad] = None) -> None:
        self.inst = inst
        self.load = load or WorkerLoad(inst.dp)

    def collect(self) -> Iterator:
        inst = self.inst
        st = inst.dp.stats(sync=False)
        bi = GaugeMetricFamily("dpu_build_info", "the dpu that runs: version, the ISA its core was compiled for, "
                               "its live I/O backends (always 1)", labels=["version", "isa", "backends"])
        bi.add_metric(list(build_info()), 1)
        yield bi

        fams = {}
        for c in PORT_COUNTERS:
            fams[c] = CounterMetricFamily(f"dpu_port_{c}", f"per port: {c.replace('_', ' ')}", labels=["port"])
        drops = CounterMetricFamily("dpu_port_drops", "per port: received packets dropped, by reason",
                                    labels=["port", "reason"])
        total_drops: Dict[str, int] = {}
        for name, c in st["ports"].items():
            for k in PORT_COUNTERS:
                fams[k].add_metric([name], c.get(k, 0))
            for r, v in c["drops"].items():
                drops.add_metric([name, r], v)
                total_drops[r] = total_drops.get(r, 0) + v
        yield from fams.values()
        yield drops
        d = CounterMetricFamily("dpu_drops", "received packets dropped, by reason (all ports)", labels=["reason"])
        for r, v in sorted(total_drops.items()):
            d.add_metric([r], v)
        yield d

        tf = {c: CounterMetricFamily(f"dpu_tenant_{c}", f"per tenant: {c.replace('_', ' ')}", labels=["tenant"])
              for c in TENANT_COUNTERS}
        td = CounterMetricFamily("dpu_tenant_drops", "per tenant: packets dropped, by reason",
                                 labels=["tenant", "reason"])
        for name, c in st["tenants"].items():
            for k in TENANT_COUNTERS:
                tf[k].add_metric([name], c.get(k, 0))
            for r, v in c["drops"].items():
                td.add_metric([name, r], v)
        yield from tf.values()
        yield td

        p = st["pmd"]
        hits = CounterMetricFamily("dpu_cache_hits", "lookups answered by a cache", labels=["cache"])
        hits.add_metric(["emc"], p["emc_hits"])
        hits.add_metric(["megaflow"], p["megaflow_hits"])
        yield hits
        yield CounterMetricFamily("dpu_cache_misses", "lookups no cache answered (upcalls)", value=p["upcalls"])
        yield GaugeMetricFamily("dpu_megaflows", "megaflows installed (all workers)", value=p["megaflows"])

        lk = CounterMetricFamily("dpu_table_lookups", "OpenFlow table lookups (slow path)", labels=["table"])
        mt = CounterMetricFamily("dpu_table_matches", "OpenFlow table lookups that matched", labels=["table"])
        for t in st["tables"]:
            lk.add_metric([str(t["table"])], t["lookups"])
            mt.add_metric([str(t["table"])], t["matches"])
        yield lk
        yield mt

        ct = st["conntrack"]
        z = GaugeMetricFamily("dpu_conntrack_connections", "tracked connections, per zone", labels=["zone"])
        for zone, n in sorted(ct["zones"].items()):
            z.add_metric([str(zone)], n)
        yield z
        yield GaugeMetricFamily("dpu_conntrack_connections_all", "tracked connections", value=ct["connections"])
        yield GaugeMetricFamily("dpu_nat_mappings", "NAT mappings (public address and port in use)",
                                value=ct["nat_mappings"])

        wp = CounterMetricFamily("dpu_worker_packets", "packets a worker received", labels=["worker"])
        wb = CounterMetricFamily("dpu_worker_batches", "batches a worker processed", labels=["worker"])
        busy = CounterMetricFamily("dpu_worker_busy_seconds", "time a worker spent on rounds that received packets",
                                   labels=["worker"])
        idle = CounterMetricFamily("dpu_worker_idle_seconds", "time a worker spent waiting for packets",
                                   labels=["worker"])
        ratio = GaugeMetricFamily("dpu_worker_busy_ratio", f"busy / (busy + idle) over the last "
                                  f"{LOAD_WINDOW_S:g} s (whoever scrapes)", labels=["worker"])
        ppb = GaugeMetricFamily("dpu_worker_packets_per_batch", f"packets per batch over the last "
                                f"{LOAD_WINDOW_S:g} s (whoever scrapes)", labels=["worker"])
        load = self.load.ratios()
        for i, w in enumerate(st["workers"]):
            lbl = [str(i)]
            wp.add_metric(lbl, w["packets"])
            wb.add_metric(lbl, w["batches"])
            busy.add_metric(lbl, w["busy_ns"] / 1e9)
            idle.add_metric(lbl, w["idle_ns"] / 1e9)
            r, per_batch = load.get(i, (0.0, 0.0))
            ratio.add_metric(lbl, r)
            ppb.add_metric(lbl, per_batch)
        yield from (wp, wb, busy, idle, ratio, ppb)

        names = {v: k for k, v in inst.dp.ports.items()}
        qf = {k: CounterMetricFamily(f"dpu_interface_{k}", h, labels=["port", "interface"])
              for k, h in _core.queue_counters()}  # counters.def
        for q in inst.interface_stats():
            lbl = [names.get(q["ofport"], str(q["ofport"])), q["ifname"]]
            for k, fam in qf.items():
                fam.add_metric(lbl, q[k])
        yield from qf.values()

        if inst.resolver:
            nh = GaugeMetricFamily("dpu_nexthop_resolved", "1 when the next hop's MAC address is known",
                                   labels=["nexthop", "ip"])
            for name, s in inst.resolver.status().items():
                nh.add_metric([name, s["ip"]], 1 if s["mac"] else 0)
            yield nh
        if getattr(inst, "evpn", None) is not None:
            yield from _evpn_metrics(inst.evpn.metrics())
        if st.get("security_groups"):
            yield from _security_metrics(st["security_groups"])


def _security_metrics(sg: dict) -> Iterator:
    """Security groups: new connections each rule allowed, packets no rule of a port's allowed."""
    hits = CounterMetricFamily("dpu_security_group_rule_hits", "new connections a security group rule allowed",
                               labels=["tenant", "group", "direction", "rule"])
    for r in sg["rules"]:
        hits.add_metric([r["tenant"], r["group"], r["direction"], str(r["rule"])], r["hits"])
    yield hits
    den = CounterMetricFamily("dpu_security_group_denied", "packets no rule of a port's security groups allowed",
                              labels=["tenant", "port", "direction"])
    for d in sg["denied"]:
        den.add_metric([d["tenant"], d["port"], d["direction"]], d["packets"])
    yield den


def _evpn_metrics(m: dict) -> Iterator:
    """The fabric mirror: learned entries in force, per tenant and kind; entries left out;
    transactions; their netlink-to-dataplane latency; the time since the last change."""
    learned = GaugeMetricFamily("dpu_evpn_learned", "entries learned from the fabric in force, per tenant and kind "
                                "(macs, neighs, flood, routes, vteps)", labels=["tenant", "kind"])
    for tenant, kinds in m["learned"].items():
        for kind, n in kinds.items():
            learned.add_metric([tenant, kind], n)
    yield learned
    skipped = GaugeMetricFamily("dpu_evpn_skipped", "learned entries left out, by reason", labels=["reason"])
    for reason, n in m["skipped"].items():
        skipped.add_metric([reason], n)
    yield skipped
    yield CounterMetricFamily("dpu_evpn_transactions", "dataplane transactions from the fabric", value=m["transactions"])
    yield CounterMetricFamily("dpu_evpn_errors", "fabric reads or commits that failed", value=m["errors"])
    lat = m.get("latency")
    if lat is not None:
        cumulative, buckets = 0, []
        for le, n in lat["buckets"]:
            cumulative += n
            buckets.append(("+Inf" if le == float("inf") else repr(float(le)), cumulative))
        yield HistogramMetricFamily("dpu_evpn_change_latency_seconds",
                                    "from the first netlink event of a fabric change (what FRR installed in the "
                                    "kernel shadow) to its dataplane transaction committed", buckets=buckets,
                                    sum_value=lat["sum_s"])
    if m["seconds_since_change"] is not None:
        yield GaugeMetricFamily("dpu_evpn_seconds_since_change", "seconds since the fabric last changed the flows",
                                value=m["seconds_since_change"])


class MetricsServer:
    """The HTTP endpoint, bound at construction, serving from start() (see the module docstring)."""

    def __init__(self, host: str, port: int, inst, limits: Limits = METRICS_LIMITS) -> None:
        from prometheus_client import ProcessCollector, make_wsgi_app

        self.load = WorkerLoad(inst.dp)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(Collector(inst, self.load))
        ProcessCollector(registry=self.registry)  # process_start_time_seconds and the other process_* metrics
        self.limits = limits
        self._host, self._port = host, port
        try:
            family, _, _, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                       flags=socket.AI_PASSIVE)[0]
        except socket.gaierror as e:
            raise LiveError(f"--metrics {host}:{port}: {e.strerror or e}") from None
        s = socket.socket(family, socket.SOCK_STREAM)
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(addr)
            s.listen(BACKLOG)
        except OSError as e:
            s.close()
            raise LiveError(f"--metrics {host}:{port}: {e.strerror or e}") from None
        self.sock = s
        self._port = s.getsockname()[1]
        self._budget = Budget(limits.max_buffered)
        handler = type("Handler", (_Handler,), {"app": staticmethod(make_wsgi_app(self.registry)),
                                                "limits": limits, "budget": self._budget})
        self.listener = Listener(s, f"metrics {self.address}", limits, lambda conn: handler(conn, _peer(conn), self))

    @property
    def address(self) -> str:
        return f"[{self._host}]:{self._port}" if ":" in self._host else f"{self._host}:{self._port}"

    @property
    def port(self) -> int:
        return self._port

    @property
    def clients(self) -> int:
        """Clients connected now."""
        return self.listener.clients

    def start(self) -> None:
        self.load.start()
        self.listener.start()

    def close(self) -> None:
        self.listener.close()
        self.load.close()


def _peer(conn: socket.socket):
    try:
        return conn.getpeername()
    except OSError:
        return None


class _Handler(BaseHTTPRequestHandler):
    """One HTTP/1.0 exchange: the request read against the client's deadline and caps,
    answered by the WSGI app, the answer sent in one piece within send_timeout."""

    app = None
    limits: Limits = METRICS_LIMITS
    budget: Budget = None

    def setup(self) -> None:
        self.connection = self.request
        self.reader = DeadlineReader(self.request, self.limits, self.budget, own_cap=self.limits.max_request)
        self.rfile = io.BufferedReader(self.reader, 4096)
        self.wfile = io.BytesIO()  # sent whole in finish(), against the send deadline

    def handle(self) -> None:
        try:
            super().handle()  # parses the request (answering 400/414/431/501 itself) and calls do_*
        except OverBudget:
            self.close_connection = True
            log.debug("metrics: a request larger than %d bytes, closed", self.limits.max_request)

    def finish(self) -> None:
        try:
            data = self.wfile.getvalue()
            if data:
                self.reader.send(data)
        finally:
            self.rfile.close()  # gives back what the reader holds

    def _call_app(self) -> None:
        path, _, query = self.path.partition("?")
        environ = {"REQUEST_METHOD": self.command, "PATH_INFO": unquote(path, "latin-1"), "QUERY_STRING": query,
                   "SERVER_PROTOCOL": self.request_version}
        for k, v in self.headers.items():
            environ["HTTP_" + k.upper().replace("-", "_")] = v
        started = []
        try:
            body = b"".join(self.app(environ, lambda status, headers: started.append((status, headers))))
            status, headers = started[0]
        except Exception as e:  # noqa: BLE001 - a failed scrape is an answer and a log line
            log.error("metrics: a scrape failed: %s: %s", type(e).__name__, e)
            log.debug("where it failed", exc_info=True)
            status, headers, body = "500 Internal Server Error", [("Content-Type", "text/plain")], b"scrape failed\n"
        code, _, reason = status.partition(" ")
        self.send_response(int(code), reason)
        for h in headers:
            self.send_header(*h)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_HEAD = do_POST = do_PUT = do_DELETE = do_OPTIONS = do_PATCH = _call_app

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - BaseHTTPRequestHandler's signature
        log.debug("metrics: %s: " + format, self.client_address, *args)
