"""The control socket and the metrics endpoint against slow, greedy and hostile local clients
(issue 26): every request gets a typed answer, both servers cap their clients, time out idle
and slow ones and bound what they buffer, and their accept loops outlive descriptor
exhaustion.

Most tests start the real servers, in this process or in a subprocess, on a temporary socket
path against a real Dataplane (no root, no interface); the last one runs `dpu run` in a
network namespace under root. Nothing here asserts a duration: waits are conditions with
generous deadlines.
"""
import dataclasses
import gzip
import http.client
import json
import logging
import os
import re
import resource
import shutil
import socket
import subprocess
import sys
import threading
import time

import pytest

from dpu import errors
from dpu.control import CONTROL_LIMITS, ControlServer, call
from dpu.metrics import METRICS_LIMITS, MetricsServer
from helpers.instances import unattached_instance

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MB = 1 << 20


# ---- helpers ----------------------------------------------------------------------------------

def wait_for(cond, what: str, deadline: float = 30.0, every: float = 0.02):
    """Polls cond() until it is true (returns its value) or fails after `deadline` seconds."""
    end = time.monotonic() + deadline
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > end:
            raise AssertionError(f"still waiting after {deadline:.0f}s for {what}")
        time.sleep(every)


def flow_table(dp) -> list:
    """The flows, without their ages."""
    return [re.sub(r" duration=[0-9.]+s,", "", str(f)) for f in dp.dump_flows()]


def connect(path: str, timeout: float = 30.0) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    s.connect(path)
    return s


def read_answer(s: socket.socket) -> dict:
    """One answer line; {} when the server closed without one."""
    buf = b""
    while not buf.endswith(b"\n"):
        try:
            chunk = s.recv(65536)
        except ConnectionResetError:
            chunk = b""
        if not chunk:
            return json.loads(buf) if buf.strip() else {}
        buf += chunk
    return json.loads(buf)


def ask(path: str, line: bytes) -> dict:
    with connect(path) as s:
        s.sendall(line + b"\n")
        return read_answer(s)


def closed_by_server(s: socket.socket) -> bool:
    """True once the server has closed `s` (reads what it may have answered first)."""
    s.setblocking(False)
    try:
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return True
    except BlockingIOError:
        return False
    except OSError:
        return True


@pytest.fixture
def thread_crashes(monkeypatch):
    """Exceptions that escaped a thread (they would print a traceback)."""
    seen = []
    monkeypatch.setattr(threading, "excepthook", lambda a: seen.append(a.exc_value))
    return seen


@pytest.fixture
def control(tmp_path):
    """start(**limits) -> a ControlServer on a temporary socket, closed at the end."""
    servers = []

    def start(**limits):
        inst = unattached_instance(tmp_path)
        srv = ControlServer(str(tmp_path / "dpu.ctl"), inst, limits=dataclasses.replace(CONTROL_LIMITS, **limits))
        srv.start()
        servers.append(srv)
        return srv

    yield start
    for s in servers:
        s.close()


@pytest.fixture
def metrics(tmp_path):
    """start(inst, **limits) -> a MetricsServer on 127.0.0.1 (a free port), closed at the end."""
    servers = []

    def start(inst, **limits):
        srv = MetricsServer("127.0.0.1", 0, inst, limits=dataclasses.replace(METRICS_LIMITS, **limits))
        srv.start()
        servers.append(srv)
        return srv

    yield start
    for s in servers:
        s.close()


def scrape(port: int, headers=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        c.request("GET", "/metrics", headers=headers or {})
        r = c.getresponse()
        return r.status, dict(r.getheaders()), r.read()
    finally:
        c.close()


def half_sent_http(port: int) -> socket.socket:
    """A scrape that never finishes its request (no blank line after the headers)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
    return s


# ---- every request gets a typed answer ----------------------------------------------------------

DEEP = b"[" * 100_000 + b"]" * 100_000

BAD_REQUESTS = [
    # (description, request line, error class, words the message has)
    ("not JSON", b"show please", "InvalidArgumentError", "request is not JSON"),
    ("not UTF-8", b'{"cmd": "show\xff"}', "InvalidArgumentError", "not UTF-8"),
    ("empty line", b"", "InvalidArgumentError", "request is not JSON"),
    ("a list", b"[1, 2]", "InvalidArgumentError", 'a request is {"cmd": NAME, "args": {...}}'),
    ("cmd not a string", b'{"cmd": 5}', "InvalidArgumentError", 'a request is {"cmd": NAME'),
    ("an extra key", b'{"cmd": "show", "id": 7}', "InvalidArgumentError", "unexpected key 'id'"),
    ("unknown command", b'{"cmd": "shutdown"}', "InvalidArgumentError", "unknown command 'shutdown'"),
    ("args a list", b'{"cmd": "show", "args": [1]}', "InvalidArgumentError", "'args' must be an object"),
    ("args to a command without", b'{"cmd": "show", "args": {"x": 1}}', "InvalidArgumentError",
     "show takes no arguments, got 'x'"),
    ("unknown argument", b'{"cmd": "dump-flows", "args": {"table": 0}}', "InvalidArgumentError",
     "dump-flows: unknown argument 'table' (it takes match, strict, json)"),
    ("nested 100,000 deep", DEEP, "InvalidArgumentError", "nested too deeply"),
    ("nested deep in args", b'{"cmd": "show", "args": {"a": ' + DEEP + b"}}", "InvalidArgumentError",
     "nested too deeply"),
    ("a lone surrogate in a flow", b'{"cmd": "mod-flows", "args": {"flow": "table=0,actions=dr\\ud800op"}}',
     "InvalidArgumentError", "mod-flows: 'flow' is not valid text: a lone surrogate (\\ud800) at character 19"),
    ("a lone surrogate in add-flows", b'{"cmd": "add-flows", "args": {"flows": [[1, "\\udc80"]]}}',
     "InvalidArgumentError", "add-flows: the text of flows[0] is not valid text: a lone surrogate"),
    ("line 2**80", b'{"cmd": "add-flows", "args": {"flows": [[1208925819614629174706176, "table=0,actions=drop"]]}}',
     "InvalidArgumentError", "add-flows: the line number of flows[0] must be 1..2147483647, got 1208925819614629174706176"),
    ("line -5", b'{"cmd": "add-flows", "args": {"flows": [[1, "table=0,actions=drop"], [-5, "table=1,actions=drop"]]}}',
     "InvalidArgumentError", "the line number of flows[1] must be 1..2147483647, got -5"),
    ("line true", b'{"cmd": "add-flows", "args": {"flows": [[true, "table=0,actions=drop"]]}}',
     "InvalidArgumentError", "the line number of flows[0] must be 1..2147483647, got true"),
    ("line 1.5", b'{"cmd": "add-flows", "args": {"flows": [[1.5, "table=0,actions=drop"]]}}',
     "InvalidArgumentError", "the line number of flows[0] must be 1..2147483647, got 1.5"),
    ("flows not pairs", b'{"cmd": "add-flows", "args": {"flows": [["table=0,actions=drop"]]}}',
     "InvalidArgumentError", "add-flows: flows[0] must be [line, text], got a list of 1"),
    ("flows missing", b'{"cmd": "add-flows", "args": {}}', "InvalidArgumentError", "add-flows needs 'flows'"),
    ("file a list", b'{"cmd": "add-flows", "args": {"flows": [[1, "table=0,actions=drop"]], "file": [1, 2]}}',
     "InvalidArgumentError", "add-flows: 'file' must be a file name (a string) or null, got a list"),
    ("strict a string", b'{"cmd": "dump-flows", "args": {"strict": "yes"}}', "InvalidArgumentError",
     "dump-flows: 'strict' must be true or false, got a string"),
    ("strict a number", b'{"cmd": "del-flows", "args": {"match": "", "strict": 1}}', "InvalidArgumentError",
     "del-flows: 'strict' must be true or false, got 1"),
    ("match null", b'{"cmd": "dump-flows", "args": {"match": null}}', "InvalidArgumentError",
     "dump-flows: 'match' must be a string, got null"),
    ("flow missing", b'{"cmd": "mod-flows", "args": {"strict": true}}', "InvalidArgumentError",
     "mod-flows needs 'flow'"),
    ("zone true", b'{"cmd": "ct-dump", "args": {"zone": true}}', "InvalidArgumentError",
     "ct-dump: 'zone' must be 0..65535 or null, got true"),
    ("zone too big", b'{"cmd": "ct-flush", "args": {"zone": 70000}}', "InvalidArgumentError",
     "ct-flush: 'zone' must be 0..65535 or null, got 70000"),
    ("zone a string", b'{"cmd": "ct-flush", "args": {"zone": "5"}}', "InvalidArgumentError",
     "ct-flush: 'zone' must be 0..65535 or null, got a string"),
    ("hex not hex", b'{"cmd": "trace", "args": {"hex": "zz", "in_port": "p1"}}', "InvalidArgumentError",
     "trace: 'hex' must be hexadecimal bytes"),
    ("in_port a number", b'{"cmd": "trace", "args": {"hex": "00", "in_port": 1}}', "InvalidArgumentError",
     "trace: 'in_port' must be a string, got 1"),
    ("a number too long for Python", b'{"cmd": "ct-dump", "args": {"zone": ' + b"9" * 5000 + b"}}",
     "InvalidArgumentError", "request is not JSON"),
]


@pytest.mark.parametrize("line,etype,words", [b[1:] for b in BAD_REQUESTS], ids=[b[0] for b in BAD_REQUESTS])
def test_each_bad_request_gets_a_typed_answer(control, line, etype, words, thread_crashes, caplog):
    """Each malformed request is answered {"ok": false, "error": {type, message}} naming what is
    wrong, nothing of it is applied, and the connection still serves the next request."""
    srv = control()
    before = flow_table(srv.inst.dp)
    with connect(srv.path) as s:
        s.sendall(line + b"\n")
        a = read_answer(s)
        assert a.get("ok") is False, a
        assert a["error"]["type"] == etype and words in a["error"]["message"], a
        assert "apply()" not in a["error"]["message"] and "incompatible" not in a["error"]["message"]
        s.sendall(b'{"cmd": "ping"}\n')
        assert read_answer(s) == {"ok": True, "result": {"pid": os.getpid()}}, "the connection still serves"
    assert flow_table(srv.inst.dp) == before, "nothing of a refused request is applied"
    assert thread_crashes == []
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_good_requests_still_work(control):
    srv = control()
    path = srv.path
    assert call(path, "ping") == {"pid": os.getpid()}
    assert len(call(path, "dump-flows", match="", strict=False)) == 2
    assert call(path, "add-flows", flows=[[3, "table=0,priority=20,in_port=p1,actions=drop"]], file="x.flows") == 1
    with pytest.raises(errors.UnknownPortError, match=r"^x\.flows:4: "):
        call(path, "add-flows", flows=[[4, "table=0,actions=output:nowhere"]], file="x.flows")
    with pytest.raises(errors.UnknownPortError) as e:  # a name that is not UTF-8, as Python decodes argv
        call(path, "add-flows", flows=[[4, "table=0,actions=output:nowhere"]], file="x\udcff.flows")
    assert str(e.value).startswith("x\udcff.flows:4: "), str(e.value)
    assert call(path, "mod-flows", flow="table=0,in_port=p2,actions=drop", strict=False) == 1
    assert call(path, "del-flows", match="table=0,in_port=p1", strict=False) == 2
    assert call(path, "ct-dump", zone=None) == [] and call(path, "ct-flush", zone=7) == 0
    tr = call(path, "trace", hex="02" * 14, in_port="p2")
    assert tr["json"]["drop_reason"] == "action_drop", tr["json"]
    assert call(path, "reload")["flows_added"] == 2
    assert call(path, "show")["ports"][0]["name"] == "p1"


HOSTILE_VALUES = [None, True, False, -1, 0, 2 ** 80, 1.5, "", "\ud800", "x\x00y", [], {}, [1, 2], [[1, "\udc80"]],
                  "[" * 50 + "]" * 50]
GOOD_ARGS = {
    "dump-flows": {"match": "table=0", "strict": False}, "mod-flows": {"flow": "table=5,actions=drop", "strict": True},
    "del-flows": {"match": "table=9", "strict": False}, "ct-dump": {"zone": 1}, "ct-flush": {"zone": 1},
    "trace": {"hex": "00" * 14, "in_port": "p1"}, "add-flows": {"flows": [[1, "table=7,actions=drop"]], "file": "f"},
}


def test_every_argument_of_every_command_against_hostile_values(control, thread_crashes, caplog):
    """Each argument of each command replaced by each hostile value (the issue fuzzed 2,056
    requests; 34 went unanswered): every one is answered, ok or with a dpu error class, and
    no message leaks the binding's internals."""
    srv = control()
    n = 0
    with connect(srv.path) as s:
        for cmd, args in GOOD_ARGS.items():
            for key in list(args) + ["unexpected"]:
                for v in HOSTILE_VALUES:
                    req = {"cmd": cmd, "args": {**args, key: v}}
                    s.sendall(json.dumps(req).encode() + b"\n")
                    a = read_answer(s)
                    n += 1
                    assert a.get("ok") in (True, False), (req, a)
                    if not a["ok"]:
                        assert isinstance(getattr(errors, a["error"]["type"], None), type), (req, a)
                        msg = a["error"]["message"]
                        assert "apply()" not in msg and "incompatible" not in msg and "Traceback" not in msg, (req, a)
    assert n == sum(len(a) + 1 for a in GOOD_ARGS.values()) * len(HOSTILE_VALUES)
    assert thread_crashes == []
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_a_client_that_hangs_up_before_its_answer_is_not_an_error(control, thread_crashes, caplog, capfd):
    """The answer to a client that has gone fails with EPIPE: logged at debug at most, no traceback."""
    caplog.set_level(logging.DEBUG)
    srv = control()
    with srv.inst.lock:  # the request waits for the lock: the client is gone before its answer is written
        with connect(srv.path) as s:
            s.sendall(b'{"cmd": "dump-flows"}\n')
        wait_for(lambda: srv.clients == 1, "the server to take the connection")
        time.sleep(0.05)  # let it read the request and block on the lock (nothing asserted on time)
    wait_for(lambda: srv.clients == 0, "the server to finish with the connection")
    assert thread_crashes == []
    assert [r for r in caplog.records if r.levelno > logging.DEBUG] == []
    out, err = capfd.readouterr()
    assert "Traceback" not in err and "BrokenPipe" not in err, err
    assert call(srv.path, "ping") == {"pid": os.getpid()}


# ---- slow and idle clients, caps ----------------------------------------------------------------

def test_idle_clients_beyond_the_cap_are_timed_out_and_the_operator_is_answered(control, thread_crashes):
    """20 idle clients against a cap of 4: the server never holds more than 4 nor starts more
    than 4 connection threads, closes each idle one after its timeout, and answers a real
    request (which waits its turn) while the others are still connected."""
    srv = control(clients=4, request_timeout=1.0)
    threads_before = threading.active_count()
    idle = []
    for _ in range(20):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.setblocking(False)
        try:
            s.connect(srv.path)
        except BlockingIOError:  # the listen backlog is full: the kernel refuses more
            s.close()
            continue
        idle.append(s)
    assert len(idle) >= 8, "enough clients to exceed the cap"
    wait_for(lambda: srv.clients == 4, "the server to fill its 4 slots")
    most = [0, 0]

    def watch():
        while not done.is_set():
            most[0] = max(most[0], srv.clients)
            most[1] = max(most[1], threading.active_count() - threads_before)
            time.sleep(0.005)

    done = threading.Event()
    w = threading.Thread(target=watch)
    w.start()
    try:
        assert call(srv.path, "ping", timeout=120) == {"pid": os.getpid()}
        wait_for(lambda: all(closed_by_server(s) for s in idle), "every idle client to be closed", deadline=120)
    finally:
        done.set()
        w.join()
        for s in idle:
            s.close()
    assert most[0] <= 4, f"{most[0]} clients held at once (cap 4)"
    assert most[1] <= 4 + 1, f"{most[1]} threads more than before (cap 4, and the watcher)"
    assert thread_crashes == []


def test_a_partial_request_gets_a_typed_timeout_answer(control):
    srv = control(request_timeout=1.0)
    with connect(srv.path, timeout=60) as s:
        s.sendall(b'{"cmd": "ping"')  # no end of line: never complete
        a = read_answer(s)
    assert a == {"ok": False, "error": {"type": "ControlError",
                                        "message": "no complete request within 1s (14 bytes received)"}}, a
    with connect(srv.path, timeout=60) as s:  # an answered client that then idles is closed too
        s.sendall(b'{"cmd": "ping"}\n')
        assert read_answer(s)["ok"] is True
        assert read_answer(s) == {}, "closed after the idle timeout, without an answer (nothing was asked)"


def test_buffered_bytes_are_capped_across_all_clients(control, thread_crashes):
    """8 clients each holding a 900 KB partial line against a 1 MB line cap and a 3 MB total:
    the first three are held, the other five are refused with a typed answer at once, the
    server never buffers more than 3 MB, and the held ones are served when they finish."""
    srv = control(max_request=1 * MB, max_buffered=3 * MB, request_timeout=120)
    pad = b" " * (900 << 10)  # JSON whitespace: the line becomes a valid request once finished
    held, refused, most = [], [], [0]
    done = threading.Event()

    def watch():
        while not done.is_set():
            most[0] = max(most[0], srv.buffered)
            time.sleep(0.001)

    w = threading.Thread(target=watch)
    w.start()
    try:
        for i in range(8):
            s = connect(srv.path, timeout=60)
            try:
                s.sendall(pad)
            except (BrokenPipeError, ConnectionResetError):
                pass
            if i < 3:
                wait_for(lambda: srv.buffered == (i + 1) * len(pad), f"client {i}'s bytes to be read")
                held.append(s)
            else:
                refused.append(read_answer(s))
                s.close()
        for a in refused:
            assert a["ok"] is False and a["error"]["type"] == "ControlError", a
            assert a["error"]["message"].startswith("the control socket buffers at most"), a
        assert srv.buffered == 3 * len(pad), "what refused clients sent is let go"
        for s in held:
            s.sendall(b'{"cmd": "ping"}\n')
            assert read_answer(s) == {"ok": True, "result": {"pid": os.getpid()}}
            s.close()
        wait_for(lambda: srv.buffered == 0, "the server to let go of every byte")
    finally:
        done.set()
        w.join()
    assert most[0] <= 3 * MB, most[0]
    with connect(srv.path, timeout=60) as s:  # the per-line cap
        try:
            s.sendall(b" " * (MB + 10))
        except (BrokenPipeError, ConnectionResetError):
            pass
        a = read_answer(s)
    assert a["error"] == {"type": "InvalidArgumentError", "message": f"request longer than {MB} bytes"}, a
    assert thread_crashes == []


# ---- the metrics endpoint ---------------------------------------------------------------------------

def test_metrics_are_what_prometheus_client_serves(tmp_path, metrics):
    """Our endpoint answers as prometheus_client's own WSGI app does for the same registry:
    status, content type and encoding, and the same metric families and samples."""
    from prometheus_client import make_wsgi_app
    from prometheus_client.parser import text_string_to_metric_families

    inst = unattached_instance(tmp_path)
    srv = metrics(inst)

    def theirs(accept=None, encoding=None):
        env = {"REQUEST_METHOD": "GET", "PATH_INFO": "/metrics", "QUERY_STRING": ""}
        if accept:
            env["HTTP_ACCEPT"] = accept
        if encoding:
            env["HTTP_ACCEPT_ENCODING"] = encoding
        got = []
        body = b"".join(make_wsgi_app(srv.registry)(env, lambda st, h: got.append((st, dict(h)))))
        return int(got[0][0].split()[0]), got[0][1], body

    def shape(body: bytes):
        return sorted((s.name, tuple(sorted(s.labels.items()))) for fam in
                      text_string_to_metric_families(body.decode()) for s in fam.samples)

    for headers in ({}, {"Accept": "application/openmetrics-text; version=1.0.0"}, {"Accept-Encoding": "gzip"}):
        status, got_headers, body = scrape(srv.port, headers)
        t_status, t_headers, t_body = theirs(headers.get("Accept"), headers.get("Accept-Encoding"))
        assert status == t_status == 200
        assert got_headers["Content-Type"] == t_headers["Content-Type"]
        assert got_headers.get("Content-Encoding") == t_headers.get("Content-Encoding")
        if got_headers.get("Content-Encoding") == "gzip":
            body, t_body = gzip.decompress(body), gzip.decompress(t_body)
        if "openmetrics" in got_headers["Content-Type"]:
            assert body.endswith(b"# EOF\n") and t_body.endswith(b"# EOF\n")
        else:
            assert shape(body) == shape(t_body) and ("dpu_port_rx_packets_total", (("port", "p1"),)) in shape(body)


def test_metrics_cap_holds_and_control_still_answers(tmp_path, control, metrics, thread_crashes):
    """40 half-sent scrapes against a cap of 8: the server never holds more than 8, the
    control socket answers while they are connected, and a real scrape, waiting its turn
    behind them, is served once the held ones are cut at their deadline."""
    ctl = control()
    srv = metrics(ctl.inst, clients=8, request_timeout=1.0)
    held = [half_sent_http(srv.port) for _ in range(40)]
    most, done = [0, 0], threading.Event()

    def watch():  # the metrics server's connection threads only (the control socket has its own)
        while not done.is_set():
            most[0] = max(most[0], srv.clients)
            most[1] = max(most[1], sum(t.name == "dpu-metrics-client" for t in threading.enumerate()))
            time.sleep(0.005)

    w = threading.Thread(target=watch)
    w.start()
    try:
        wait_for(lambda: srv.clients == 8, "the metrics server to fill its slots")
        assert call(ctl.path, "show")["ports"][0]["name"] == "p1", "the control socket answers meanwhile"
        status, headers, body = scrape(srv.port)
        assert status == 200 and b"dpu_port_rx_packets_total" in body, (status, body[:200])
    finally:
        done.set()
        w.join()
        for s in held:
            s.close()
    assert most[0] <= 8, f"{most[0]} metrics clients at once (cap 8)"
    assert 0 < most[1] <= 8, f"{most[1]} metrics connection threads at once (cap 8)"
    assert thread_crashes == []


def test_a_slow_scrape_is_cut_at_its_deadline(tmp_path, metrics):
    """A client dribbling its request one byte at a time (slowloris) is closed when its
    request deadline passes, though it never stops sending."""
    srv = metrics(unattached_instance(tmp_path), request_timeout=1.0)
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=30)
    request = b"GET /metrics HTTP/1.1\r\nHost: x\r\n" + b"X-Pad: " + b"a" * 100_000
    cut = False
    end = time.monotonic() + 60
    for b in request:
        if time.monotonic() > end:
            break
        try:
            s.send(bytes([b]))
        except OSError:
            cut = True
            break
        if closed_by_server(s):
            cut = True
            break
        s.setblocking(True)
        time.sleep(0.05)
    s.close()
    assert cut, "the server kept a dribbling client beyond its deadline"


# ---- descriptors: exhausted, then recovered --------------------------------------------------------------

SERVER = r"""
import dataclasses, json, logging, os, resource, sys
from helpers.instances import unattached_instance
from dpu.control import CONTROL_LIMITS, ControlServer
from dpu.metrics import METRICS_LIMITS, MetricsServer
import pathlib

logging.basicConfig(stream=sys.stderr, level=logging.DEBUG, format="%(levelname)s %(name)s: %(message)s")
cfg = json.loads(sys.argv[1])
inst = unattached_instance(pathlib.Path(cfg["dir"]))
ctl = ControlServer(cfg["ctl"], inst, limits=dataclasses.replace(CONTROL_LIMITS, **cfg.get("control", {})))
met = MetricsServer("127.0.0.1", 0, inst, limits=dataclasses.replace(METRICS_LIMITS, **cfg.get("metrics", {})))
ctl.start()
met.start()
if cfg.get("spare_fds"):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + cfg["spare_fds"], hard))
print(json.dumps({"metrics": met.port, "pid": os.getpid()}), flush=True)
sys.stdin.read()
ctl.close()
met.close()
print("closed", flush=True)
"""


class ServerProcess:
    """The two servers in a child process (its own descriptor limit, memory and stderr)."""

    def __init__(self, tmp_path, **cfg):
        self.ctl = str(tmp_path / "dpu.ctl")
        script = tmp_path / "server.py"
        script.write_text(SERVER)
        cfg = {"dir": str(tmp_path), "ctl": self.ctl, **cfg}
        self.err_path = tmp_path / "server.err"
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [os.path.dirname(__file__)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
        self.proc = subprocess.Popen([sys.executable, str(script), json.dumps(cfg)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=open(self.err_path, "w"), text=True, cwd=ROOT, env=env)
        line = self.proc.stdout.readline()
        assert line, self.stderr()
        info = json.loads(line)
        self.metrics_port, self.pid = info["metrics"], info["pid"]

    def stderr(self) -> str:
        return self.err_path.read_text()

    def status(self, key: str) -> int:
        """A /proc/PID/status field in kB."""
        for line in open(f"/proc/{self.pid}/status"):
            if line.startswith(key + ":"):
                return int(line.split()[1])
        raise KeyError(key)

    def stop(self) -> str:
        out, _ = self.proc.communicate("", timeout=60)
        assert self.proc.returncode == 0 and "closed" in out, (self.proc.returncode, out, self.stderr())
        return self.stderr()


def test_accept_survives_descriptor_exhaustion_and_the_control_socket_answers_after(tmp_path):
    """The servers run with 8 spare descriptors; 60 half-sent scrapes and 60 idle control
    clients exhaust them. Both accept loops log the failure once and keep trying; once the
    clients leave, the control socket and the metrics endpoint answer again. (Before the fix
    the control accept thread returned on EMFILE and the socket never answered again.)"""
    srv = ServerProcess(tmp_path, spare_fds=8, control={"request_timeout": 120}, metrics={"request_timeout": 120})
    try:
        scrapes = [half_sent_http(srv.metrics_port) for _ in range(60)]
        idle = []
        for _ in range(60):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.setblocking(False)
            try:
                s.connect(srv.ctl)
                idle.append(s)
            except BlockingIOError:
                s.close()
        wait_for(lambda: "Too many open files" in srv.stderr(), "the server to run out of descriptors")
        wait_for(lambda: re.search(r"control socket .*: cannot accept .*again, 3 in a row", srv.stderr()),
                 "the control accept to fail three times")
        for s in scrapes + idle:
            s.close()
        assert call(srv.ctl, "show", timeout=120)["ports"][1]["name"] == "p2"
        assert wait_for(lambda: scrape(srv.metrics_port)[0] == 200, "a scrape to succeed", deadline=60)
    finally:
        err = srv.stop()
    assert "Traceback" not in err, err
    fails = re.findall(r"^WARNING dpu\.serving: (control socket|metrics) .*: cannot accept a client: .*$", err, re.M)
    again = re.findall(r"^INFO dpu\.serving: (control socket|metrics) .*: accepting again after (\d+) failed "
                       r"accepts", err, re.M)
    assert "control socket" in fails, err
    assert any(who == "control socket" for who, _ in again), err
    assert sum(int(n) for _, n in again) > len(again), "several failures in an episode, one warning each: " + err
    assert len(fails) <= len(again) + 2, "one warning per episode, not per failed accept: " + err


def test_memory_stays_bounded_with_large_partial_lines(tmp_path):
    """Eight clients each send a 60 MB partial line (the issue: 240 MB -> 900 MB). With the
    default limits the server's peak memory grows by at most what it may buffer in total
    (plus the room to parse one line), and every client beyond it gets a typed refusal."""
    srv = ServerProcess(tmp_path)
    line = b" " * (60 * MB)
    answers = [None] * 8
    try:
        base = srv.status("VmHWM")

        def client(i):
            s = connect(srv.ctl, timeout=120)
            try:
                s.sendall(line)
            except (BrokenPipeError, ConnectionResetError):
                pass
            answers[i] = read_answer(s)  # refused at once, or timed out after the request timeout
            s.close()

        ts = [threading.Thread(target=client, args=(i,)) for i in range(8)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(300)
        peak = srv.status("VmHWM")
    finally:
        err = srv.stop()
    assert all(a and a["ok"] is False and a["error"]["type"] == "ControlError" for a in answers), answers
    refused = [a for a in answers if a["error"]["message"].startswith("the control socket buffers at most")]
    assert len(refused) >= 6, answers
    grown = (peak - base) << 10
    assert grown <= CONTROL_LIMITS.max_buffered + 64 * MB, f"peak grew by {grown / MB:.0f} MB"
    assert "Traceback" not in err, err


# ---- dpu run, live, under root --------------------------------------------------------------------------

ATTACKER = r"""
import select, socket, sys, time
metrics_port, ctl, n_http, n_ctl = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
held, pending = [], []
for _ in range(n_http):  # non-blocking: connects the server does not accept yet stay pending (SYN retried)
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setblocking(False)
    s.connect_ex(("127.0.0.1", metrics_port))
    pending.append(s)
poll = select.poll()
by_fd = {s.fileno(): s for s in pending}
for fd in by_fd:
    poll.register(fd, select.POLLOUT)
end = time.monotonic() + 5
while by_fd and time.monotonic() < end:
    for fd, _ in poll.poll(200):
        poll.unregister(fd)
        s = by_fd.pop(fd)
        pending.remove(s)
        if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:
            try:
                s.send(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
            except OSError:
                pass
        held.append(s)
for _ in range(n_ctl):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.setblocking(False)
    try:
        s.connect(ctl)
        held.append(s)
    except OSError:
        s.close()
print(len(held) + len(pending), len(held), flush=True)
sys.stdin.read()
"""


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@pytest.mark.netns
def test_dpu_run_outlives_a_metrics_flood(tmp_path, netns_ok):
    """The issue's scenario on a real `dpu run` (AF_PACKET on a veth in a namespace), started
    with a soft descriptor limit of 256 under a hard one of 8192: dpu raises the soft limit to
    the hard one, 1,100 half-sent scrapes and 100 idle control clients leave its descriptor
    count bounded by the caps, `dpu show` answers while they are connected and after they
    leave, and a scrape succeeds again."""
    from netns import sh

    ns = f"dpuctl-{os.getpid()}"
    sh("ip", "netns", "add", ns)
    proc = None
    try:
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh("ip", "-n", ns, "link", "add", "dpa", "type", "veth", "peer", "name", "dpb")
        sh("ip", "-n", ns, "link", "set", "dpa", "up")
        sh("ip", "-n", ns, "link", "set", "dpb", "up")
        flows = tmp_path / "f.flows"
        flows.write_text("table=0,actions=drop\n")
        ctl = str(tmp_path / "dpu.ctl")
        port = 19126

        def limit():
            resource.setrlimit(resource.RLIMIT_NOFILE, (256, 8192))

        proc = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-m", "dpu.cli", "run", "--flows",
                                 str(flows), "--port", "p1=dpa", "--ctl", ctl, "--metrics", f"127.0.0.1:{port}"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                                preexec_fn=limit, env={**os.environ, "DPU_LOG": "debug"})
        wait_for(lambda: os.path.exists(ctl) or proc.poll() is not None, "dpu run to start")
        assert proc.poll() is None, proc.communicate()
        pid = call(ctl, "ping")["pid"]
        soft = [line for line in open(f"/proc/{pid}/limits") if line.startswith("Max open files")][0].split()
        assert soft[3:5] == ["8192", "8192"], f"soft and hard limits of dpu run: {soft}"
        base = _fds(pid)
        attacker = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c",
                                     f"import resource; resource.setrlimit(resource.RLIMIT_NOFILE, (4096, 4096))\n"
                                     + ATTACKER, str(port), ctl, "1100", "100"],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            tried, connected = map(int, attacker.stdout.readline().split())
            assert tried >= 1100 and connected > CONTROL_LIMITS.clients + METRICS_LIMITS.clients, (tried, connected)
            most = _fds(pid)
            show = subprocess.run([sys.executable, "-m", "dpu.cli", "show", "--ctl", ctl, "--json"],
                                  capture_output=True, text=True, timeout=300, cwd=ROOT)
            assert show.returncode == 0 and json.loads(show.stdout)["pid"] == pid, show.stderr
            most = max(most, _fds(pid))
        finally:
            attacker.communicate("", timeout=60)
        limits = CONTROL_LIMITS.clients + METRICS_LIMITS.clients
        assert most <= base + limits + 8, f"dpu held {most} descriptors (from {base}; caps {limits})"
        r = subprocess.run([sys.executable, "-m", "dpu.cli", "show", "--ctl", ctl, "--json"],
                           capture_output=True, text=True, timeout=120, cwd=ROOT)
        assert r.returncode == 0 and json.loads(r.stdout)["pid"] == pid, r.stderr

        def scraped():
            r = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c",
                                f"import urllib.request; print(urllib.request.urlopen("
                                f"'http://127.0.0.1:{port}/metrics', timeout=10).status)"],
                               capture_output=True, text=True)
            return r.stdout.strip() == "200"
        wait_for(scraped, "a scrape to succeed after the flood", deadline=60, every=0.5)
    finally:
        if proc is not None:
            proc.terminate()
            out, err = proc.communicate(timeout=60)
        sh("ip", "netns", "del", ns, check=False)
    assert proc.returncode == 0, err
    assert "Traceback" not in err, err
    assert re.search(r"^\S+Z dpu: debug: raised the open-file limit from 256 to 8192", err, re.M), err
    assert re.search(r"^\S+Z dpu: warning: metrics .*: 16 clients at once, the most it serves", err, re.M), err


def test_raise_fd_limit_takes_the_hard_limit():
    """Unit check of the function `dpu run` calls first (in a child: the limit is per process)."""
    code = ("import resource\n"
            "from dpu.live import raise_fd_limit\n"
            "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
            "resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))\n"
            "before, after = raise_fd_limit()\n"
            "want = hard if hard != resource.RLIM_INFINITY else int(open('/proc/sys/fs/nr_open').read())\n"
            "print(before, after, want, resource.getrlimit(resource.RLIMIT_NOFILE) == (want, hard))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    before, after, want, same = r.stdout.split()
    assert (before, after, same) == ("64", want, "True"), r.stdout
