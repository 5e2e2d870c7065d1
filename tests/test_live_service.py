"""`dpu run` as a service (issue 30, "Signals and state"): SIGHUP reloads, every other
terminating signal stops it leaving nothing behind, the drops pcapng is readable while dpu
runs and after a SIGKILL, systemd's readiness protocol, the pidfile, the descriptor limit
and the systemd unit in contrib/.

The live tests run dpu in tests/livelab.py's namespaces (root); the others run anywhere.
"""
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest
import yaml

from helpers.wait import wait_for
from livelab import ROOT, Lab
from netns import nsexec

from dpu import control
from dpu.errors import LiveError
from dpu.service import STOP_SIGNALS, Notifier, PidFile, Signals

live = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("ethtool"),
                          reason="live tests need root and ethtool (network namespaces, AF_PACKET)")
needs_tshark = pytest.mark.skipif(not shutil.which("tshark"), reason="tshark is not installed (apt-get install tshark)")
UNIT = os.path.join(ROOT, "contrib", "systemd", "dpu.service")
MB = 1 << 20


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    if os.geteuid() != 0 or not shutil.which("ethtool"):
        pytest.skip("live tests need root and ethtool")
    lab = Lab(str(tmp_path_factory.mktemp("svc")))
    yield lab
    lab.close()
    assert lab.leftovers() == []


class NotifySocket:
    """The service manager's end of NOTIFY_SOCKET: an AF_UNIX datagram socket; each
    message is a dict of its KEY=VALUE lines."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(path)
        self.seen: list = []

    def next(self, timeout: float = 30) -> dict:
        self.sock.settimeout(timeout)
        data = self.sock.recv(4096).decode()
        msg = dict(line.split("=", 1) for line in data.splitlines() if line)
        self.seen.append(msg)
        return msg

    def until(self, key: str, timeout: float = 30) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            msg = self.next(max(0.1, deadline - time.monotonic()))
            if key in msg:
                return msg

    def close(self) -> None:
        self.sock.close()


def gro(lab, dev: str) -> str:
    out = nsexec(lab.ns["dpu"], "ethtool", "-k", dev).stdout
    return re.search(r"^generic-receive-offload: (\w+)", out, re.M).group(1)


def knock(lab, n: int = 3, port: int = 9999) -> None:
    """n datagrams from the internet to the NAT's public address, which nothing inside asked
    for: dpu drops each (nat_unsolicited). Sent and not waited for."""
    nsexec(lab.ns["inet"], sys.executable, "-c",
           "import socket;s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n"
           f"for i in range({n}): s.sendto(b'knock%d' % i, ('203.0.113.10', {port}))")


def stats(d) -> dict:
    """The running dpu's counters, through its control socket from this process."""
    return control.call(d.ctl, "stats")


def dropped(d, port: str = "inet") -> int:
    return stats(d)["ports"][port]["dropped"]


def drop_rows(path: str) -> list:
    """The drops file as tshark reads it: (comment, udp.dstport) per packet; fails unless
    tshark reads it whole."""
    r = subprocess.run(["tshark", "-r", path, "-T", "fields", "-E", "separator=|", "-e", "frame.comment",
                        "-e", "udp.dstport"], capture_output=True, text=True, timeout=60)
    complaints = [line for line in r.stderr.splitlines() if "Running as user" not in line]  # tshark as root
    assert r.returncode == 0 and not complaints, (r.returncode, r.stderr)
    return [tuple(line.split("|")) for line in r.stdout.splitlines()]


def stale_pid() -> int:
    """The id of a process that has ended."""
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


# ---- signals ----------------------------------------------------------------------------------

@live
def test_sighup_reloads_under_traffic(lab, tmp_path, monkeypatch):
    """SIGHUP is `dpu reload`: the topology file's new floating address answers, a transfer
    running across it arrives whole, counters go on, the socket and pidfile stay; the
    service manager hears RELOADING=1 then READY=1. Then SIGTERM leaves nothing behind."""
    topo = lab.topology()
    pidfile = tmp_path / "dpu.pid"
    note = NotifySocket(str(tmp_path / "notify"))
    monkeypatch.setenv("NOTIFY_SOCKET", note.path)
    d = lab.start_dpu(topo=topo, extra=("--pidfile", str(pidfile)))
    try:
        assert note.until("READY")["READY"] == "1"
        assert pidfile.read_text() == f"{d.proc.pid}\n"
        echo = lab.peer("vm1", "udp-echo", "7001")
        assert lab.udp_ask("inet", "203.0.113.11", 7001, "before") == "timeout", "no floating address yet"
        srv, cli = lab.start_transfer("rblue", "vm1", "10.0.0.21", 5401, 8 * MB, 4 * MB)  # about 2 s
        wait_for(lambda: stats(d)["ports"]["vm1"]["rx_packets"] > 100, 30, "the transfer under way")
        before = stats(d)
        t = yaml.safe_load(open(topo))
        t["tenants"]["blue"]["nat"]["floating"].append({"private": "10.0.0.11", "public": "203.0.113.11"})
        with open(topo, "w") as f:
            yaml.safe_dump(t, f)
        d.proc.send_signal(signal.SIGHUP)
        assert "RELOADING" in note.until("RELOADING")
        assert note.until("READY")["READY"] == "1"
        assert lab.udp_ask("inet", "203.0.113.11", 7001, "after").endswith("|after"), "the new floating address"
        assert lab.finish(srv, cli) == "10.0.0.11", "the transfer went on through the reload, whole"
        after = stats(d)
        assert after["ports"]["vm1"]["rx_packets"] > before["ports"]["vm1"]["rx_packets"], "counters go on"
        assert after["workers_total"]["packets"] > before["workers_total"]["packets"]
        for port in ("vm1", "p0"):  # the transfer's two ports: nothing of it dropped
            assert after["ports"][port]["dropped"] == before["ports"][port]["dropped"], (port, after["ports"][port])
        assert os.path.exists(d.ctl) and pidfile.exists()
        assert d.proc.poll() is None
        echo.kill()
        rc, out, err = d.stop(signal.SIGTERM)
        assert note.until("STOPPING")["STOPPING"] == "1"
    finally:
        note.close()
    assert rc == 0, err
    assert re.search(r"^\S+Z dpu: info: SIGHUP: reloaded: \d+ flows added, \d+ deleted, version \d+", err, re.M), err
    assert "Ran " in out and "Traceback" not in err
    assert not os.path.exists(d.ctl) and not pidfile.exists()


@live
@pytest.mark.parametrize("sig, times", [(signal.SIGTERM, 1), (signal.SIGINT, 2), (signal.SIGQUIT, 1)])
def test_stop_signals_leave_nothing_behind(lab, tmp_path, sig, times):
    """Each terminating signal: the final counters, no socket, GRO back on, no pidfile (one
    left by a dpu that is gone is replaced), a complete drops file, exit 0. A second one
    (Ctrl-C twice) changes nothing."""
    nsexec(lab.ns["dpu"], "ethtool", "-K", "p0", "gro", "on")
    pidfile = tmp_path / "dpu.pid"
    pidfile.write_text(f"{stale_pid()}\n")
    drops = tmp_path / "drops.pcapng"
    try:
        d = lab.start_dpu(extra=("--pidfile", str(pidfile), "--drops-pcap", str(drops)))
        assert gro(lab, "p0") == "off" and pidfile.read_text() == f"{d.proc.pid}\n"
        knock(lab)
        wait_for(lambda: dropped(d) >= 3, 20, "three drops")
        for _ in range(times - 1):
            d.proc.send_signal(sig)
        rc, out, err = d.stop(sig)
        assert gro(lab, "p0") == "on", "GRO back on"
    finally:
        nsexec(lab.ns["dpu"], "ethtool", "-K", "p0", "gro", "off")  # as the lab made it
    assert rc == 0, err
    assert "Interfaces:" in out and "Ran " in out and "Traceback" not in err
    assert not os.path.exists(d.ctl) and not pidfile.exists()
    m = re.search(r"^drops: (\d+) packets written to ", out, re.M)
    assert m and int(m.group(1)) >= 3, out
    if shutil.which("tshark"):
        rows = drop_rows(str(drops))
        assert len(rows) == int(m.group(1)) and rows.count(("drop_reason=nat_unsolicited in_port=inet", "9999")) == 3


@live
def test_a_refused_reload_keeps_dpu_running(lab, tmp_path, monkeypatch):
    """A topology file broken on disk: SIGHUP says why and changes nothing; dpu forwards on
    and says READY=1 again."""
    topo = lab.topology()
    note = NotifySocket(str(tmp_path / "notify"))
    monkeypatch.setenv("NOTIFY_SOCKET", note.path)
    d = lab.start_dpu(topo=topo)
    try:
        note.until("READY")
        good = open(topo).read()
        with open(topo, "w") as f:
            f.write(good.replace("vni: 200", "vni: 100"))
        d.proc.send_signal(signal.SIGHUP)
        note.until("RELOADING")
        assert note.until("READY")["READY"] == "1"
        assert lab.ping("vm3", "10.0.0.21", count=1), "red still forwards"
        rc, out, err = d.stop(signal.SIGTERM)
        note.until("STOPPING")
    finally:
        note.close()
    assert rc == 0, err
    assert re.search(r"^\S+Z dpu: error: SIGHUP: reload refused, the running tables stay: TopologyError: .*", err, re.M), err
    assert [m.get("READY") or m.get("RELOADING") or m.get("STOPPING") for m in note.seen] == ["1", "1", "1", "1"]


# ---- the drops file ---------------------------------------------------------------------------

@live
@needs_tshark
def test_drops_pcap_is_readable_while_dpu_runs_and_after_sigkill(lab, tmp_path):
    drops = str(tmp_path / "drops.pcapng")
    d = lab.start_dpu(extra=("--drops-pcap", drops))
    try:
        assert drop_rows(drops) == [], "a pcapng file with no packet yet, not an empty file"
        knock(lab, 3, 9999)
        wait_for(lambda: dropped(d) >= 3, 20, "three drops counted")
        # written when their batch ended: the first read nearly always finds them
        rows = wait_for(lambda: [r for r in drop_rows(drops) if r[1] == "9999"], 10, "the drops in the file")
        assert rows == [("drop_reason=nat_unsolicited in_port=inet", "9999")] * 3
        assert d.proc.poll() is None, "read while dpu runs"
        knock(lab, 2, 9998)
        wait_for(lambda: dropped(d) >= 5, 20, "two more drops counted")
        d.proc.send_signal(signal.SIGKILL)
        d.proc.communicate(timeout=30)
    finally:
        if d.proc.poll() is None:
            d.proc.kill()
    assert d.proc.returncode == -signal.SIGKILL
    rows = drop_rows(drops)
    assert rows.count(("drop_reason=nat_unsolicited in_port=inet", "9998")) == 2, rows


# ---- NOTIFY_SOCKET, the pidfile, the descriptor limit --------------------------------------------

def test_notifier_speaks_sd_notify(tmp_path, monkeypatch):
    """One datagram of KEY=VALUE lines per message, to a path or an abstract name; the
    variable is taken out of the environment (programs dpu starts do not inherit it)."""
    note = NotifySocket(str(tmp_path / "n"))
    monkeypatch.setenv("NOTIFY_SOCKET", note.path)
    n = Notifier()
    assert "NOTIFY_SOCKET" not in os.environ
    n.ready("forwarding on vm1=eth0")
    n.reloading()
    n.stopping("stopping (SIGTERM)")
    n.close()
    ready, reloading, stopping = (note.next(5) for _ in range(3))
    note.close()
    assert ready == {"READY": "1", "STATUS": "forwarding on vm1=eth0"}
    assert reloading["RELOADING"] == "1" and int(reloading["MONOTONIC_USEC"]) > 0
    assert stopping == {"STOPPING": "1", "STATUS": "stopping (SIGTERM)"}
    abstract = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    abstract.bind(f"\0dpu-test-{os.getpid()}")
    n = Notifier({"NOTIFY_SOCKET": f"@dpu-test-{os.getpid()}"})
    n.send(READY=1)
    abstract.settimeout(5)
    assert abstract.recv(100) == b"READY=1\n"
    abstract.close()
    n.send(READY=1)  # nobody listens any more: a warning, no exception
    assert Notifier({}).address is None and Notifier({"NOTIFY_SOCKET": "vsock:2:1"}).address is None


def test_signals_are_noted_and_acted_on_outside_the_handler():
    before = signal.getsignal(signal.SIGHUP)
    s = Signals()
    s.install()
    try:
        assert signal.getsignal(signal.SIGHUP) == s._on_hup
        os.kill(os.getpid(), signal.SIGHUP)
        os.kill(os.getpid(), signal.SIGHUP)
        s.wait(5)
        assert s.take_reload() and not s.take_reload(), "two HUPs in a row: one reload"
        assert s.stop is None
        os.kill(os.getpid(), signal.SIGUSR2)
        s.wait(5)
        assert s.stop == signal.SIGUSR2
    finally:
        s.close()
    assert signal.getsignal(signal.SIGHUP) == before, "restored"
    assert {signal.SIGINT, signal.SIGTERM, signal.SIGQUIT, signal.SIGRTMIN} <= set(STOP_SIGNALS)
    assert not {signal.SIGKILL, signal.SIGSEGV, signal.SIGABRT, signal.SIGPIPE} & set(STOP_SIGNALS)


def test_pidfile_check_write_remove(tmp_path):
    path = tmp_path / "run" / "dpu.pid"
    p = PidFile(str(path))
    p.check()  # none there, its directory neither: made by write()
    p.write()
    assert path.read_text() == f"{os.getpid()}\n"
    p.remove()
    assert not path.exists()
    path.write_text(f"{stale_pid()}\n")
    PidFile(str(path)).check()  # stale: replaced
    alive = subprocess.Popen(["sleep", "30"])
    try:
        path.write_text(f"{alive.pid}\n")
        with pytest.raises(LiveError, match=rf"--pidfile {re.escape(str(path))}: process {alive.pid} is running"):
            PidFile(str(path)).check()
    finally:
        alive.kill()
        alive.wait()
    path.write_text("tenants:\n  blue: {}\n")
    with pytest.raises(LiveError, match="holds something other than a process id"):
        PidFile(str(path)).check()
    with pytest.raises(LiveError, match="is a directory"):
        PidFile(str(tmp_path)).check()
    path.write_text("1\n")  # someone else's now: remove() leaves it
    p.written = True
    p.remove()
    assert path.read_text() == "1\n"


@pytest.mark.skipif(not shutil.which("prlimit"), reason="needs prlimit (util-linux)")
def test_a_descriptor_limit_too_low_is_refused_first(tmp_path):
    """A hard limit under what dpu run may need: one line saying how many and how to raise
    them, before anything else is checked or made (no root needed to see it)."""
    flows = tmp_path / "f.flows"
    flows.write_text("actions=drop\n")
    ctl = str(tmp_path / "x.ctl")
    r = subprocess.run(["prlimit", "--nofile=40:40", sys.executable, "-m", "dpu.cli", "run", "--flows", str(flows),
                        "--workers", "2", "--port", "a=nosuch0", "--port", "b=nosuch1", "--ctl", ctl],
                       capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert (r.returncode, r.stdout, r.stderr) == (1, "", (
        "dpu: LiveError: dpu run needs 105 open files (4 queue(s), twice; 33 for the servers' clients; 64 more); "
        "its limit is 40 (hard limit 40): raise it before starting dpu (ulimit -n 105, as root for more than the "
        "hard limit; LimitNOFILE=105 in a systemd unit)\n"))
    assert not os.path.exists(ctl)


@live
def test_dpu_run_raises_a_low_soft_descriptor_limit(lab):
    d = lab.start_dpu(prefix=("prlimit", "--nofile=40:4096"))
    with open(f"/proc/{d.proc.pid}/limits") as f:
        assert re.search(r"^Max open files\s+4096\s+4096", f.read(), re.M)
    rc, _, err = d.stop()
    assert rc == 0, err


@live
def test_pidfile_of_a_running_process_is_refused(lab, tmp_path):
    pidfile = tmp_path / "dpu.pid"
    pidfile.write_text(f"{os.getpid()}\n")
    topo = lab.topology()
    ctl = str(tmp_path / "x.ctl")
    r = lab.run_dpu("--config", topo, "--port", "vm1=vm1", "--ctl", ctl, "--pidfile", str(pidfile))
    assert r.returncode == 1 and r.stderr == (f"dpu: LiveError: --pidfile {pidfile}: process {os.getpid()} is running "
                                              "(a dpu already? stop it, or choose another --pidfile)\n"), r.stderr
    assert pidfile.read_text() == f"{os.getpid()}\n" and not os.path.exists(ctl)
    r = lab.run_dpu("--config", topo, "--port", "vm1=vm1", "--ctl", ctl, "--pidfile", topo)
    assert r.returncode == 1 and r.stderr == (f"dpu: LiveError: --pidfile {topo}: is the file --config names too "
                                              "(choose another --pidfile)\n"), r.stderr
    other = tmp_path / "notes.txt"
    other.write_text("not a pid\n")
    r = lab.run_dpu("--config", topo, "--port", "vm1=vm1", "--ctl", ctl, "--pidfile", str(other))
    assert r.returncode == 1 and "holds something other than a process id" in r.stderr, r.stderr
    assert other.read_text() == "not a pid\n"


# ---- the systemd unit ---------------------------------------------------------------------------

def _unit(path: str) -> dict:
    out: dict = {}
    section = None
    for line in open(path):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        k, v = line.split("=", 1)
        out.setdefault(section, {})[k] = v
    return out


def test_systemd_unit_runs_dpu_as_a_notify_service():
    """Type=notify, reload by SIGHUP, and an ExecStart whose options dpu run accepts (with
    the defaults file's DPU_ARGS)."""
    from dpu.cli import _parser

    u = _unit(UNIT)
    svc = u["Service"]
    assert svc["Type"] == "notify" and svc["ExecReload"] == "/bin/kill -HUP $MAINPID"
    env = dict(line.strip().split("=", 1) for line in open(os.path.join(ROOT, "contrib", "systemd", "dpu.default"))
               if line.strip() and not line.startswith("#"))
    cmd = shlex.split(svc["ExecStart"].replace("$DPU_ARGS", shlex.split(env["DPU_ARGS"])[0]))
    assert os.path.basename(cmd[0]) == "dpu" and cmd[1] == "run"
    args = _parser().parse_args(cmd[1:])
    assert args.pidfile == svc["PIDFile"] and args.ctl.startswith("/run/" + svc["RuntimeDirectory"] + "/")
    assert int(svc["LimitNOFILE"]) >= 4096
    if shutil.which("systemd-analyze"):
        r = subprocess.run(["systemd-analyze", "verify", UNIT], capture_output=True, text=True, timeout=60)
        problems = [line for line in r.stderr.splitlines() if "dpu.service" in line and "/usr/local/bin/dpu" not in line]
        assert not problems, r.stderr
