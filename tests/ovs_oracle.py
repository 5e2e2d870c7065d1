"""Open vSwitch itself as a test oracle (issue 8; used by tests/test_ovs_compat.py).

A private ovsdb-server and ovs-vswitchd run in a temporary directory (OVS_RUNDIR,
OVS_DBDIR, OVS_LOGDIR all point there) with ``--enable-dummy=override
--disable-system --disable-system-route``: no kernel module, no kernel device,
nothing outside that directory is touched. One bridge, ``datapath_type=netdev``
(the userspace datapath, the one dpu mirrors), ``fail_mode=secure`` (no
controller, no NORMAL fallback), OpenFlow 1.3 only, and one ``dummy`` port per
dpu port with the same name and the same OpenFlow port number (dpu numbers the
ports of ``Dataplane(ports=[...])`` 1, 2, 3, ... in order), each writing what it
sends to ``options:tx_pcap``.

A case is loaded with ``ovs-ofctl -O OpenFlow13 add-groups`` / ``add-flows`` after
``del-flows`` / ``del-groups``; ``revalidator/purge`` then empties the datapath's
flow cache so that no megaflow of an earlier case survives. Each packet is injected
with ``netdev-dummy/receive`` and followed by an OpenFlow barrier, whose reply
comes after the packet has been processed: the dummy port's receive queue is
polled by the main loop before the OpenFlow connections are serviced, and the
barrier can only be read in an iteration after the one that queued the packet.
What the tx pcaps grew by since the packet was sent is then that packet's output.

The unixctl commands (``ovs-appctl``'s JSON-RPC) and the barrier (an OpenFlow 1.3
hello and BARRIER_REQUEST on the bridge's ``br0.mgmt`` socket, what ``ovs-ofctl``
would send) are spoken directly rather than through one process per packet: a
packet costs well under a millisecond instead of ~15 ms.

Both daemons are children of the test process (killed with it: PR_SET_PDEATHSIG),
stopped by PID at the end, and the directory is removed: by ``stop()``, or at exit
or on SIGTERM, SIGINT or SIGHUP of the process that started them (dpu.cleanup).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import time
from typing import Dict, List, Optional, Sequence, Tuple

from dpu import cleanup

OVS_BINARIES = ("ovs-vswitchd", "ovsdb-server", "ovsdb-tool", "ovs-vsctl", "ovs-ofctl")
SCHEMA_PATHS = ("/usr/share/openvswitch/vswitch.ovsschema", "/usr/local/share/openvswitch/vswitch.ovsschema")
BRIDGE = "br0"


def missing_reason() -> Optional[str]:
    """Why the oracle cannot run here, or None."""
    for b in OVS_BINARIES:
        if not shutil.which(b) and not os.path.exists(f"/usr/sbin/{b}"):
            return f"{b} is not installed (apt-get install openvswitch-switch; CI installs it)"
    if not any(os.path.exists(p) for p in SCHEMA_PATHS):
        return "vswitch.ovsschema not found (apt-get install openvswitch-switch)"
    return None


def _which(b: str) -> str:
    return shutil.which(b) or f"/usr/sbin/{b}"


class OvsError(RuntimeError):
    pass


class _Stream:
    """A unix stream socket to one of the daemon's sockets, and what it has sent."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.sock.settimeout(30)
        self.buf = b""

    def close(self) -> None:
        self.sock.close()


class _Unixctl(_Stream):
    """ovs-appctl's protocol: JSON-RPC 1.0 objects on a unix stream socket."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.id = 0
        self.dec = json.JSONDecoder()

    def call(self, method: str, *params: str) -> str:
        self.id += 1
        self.sock.sendall(json.dumps({"id": self.id, "method": method, "params": list(params)}).encode())
        while True:
            text = self.buf.decode(errors="replace").lstrip()
            if text:
                try:
                    msg, end = self.dec.raw_decode(text)
                except ValueError:
                    msg = None
                if msg is not None:
                    self.buf = text[end:].encode()
                    if msg.get("id") != self.id:
                        continue
                    if msg.get("error") is not None:
                        raise OvsError(f"{method} {' '.join(params)[:120]}: {msg['error']}")
                    return msg.get("result") or ""
            chunk = self.sock.recv(65536)
            if not chunk:
                raise OvsError("unixctl connection closed")
            self.buf += chunk


class _OpenFlow(_Stream):
    """Just enough OpenFlow 1.3 for a barrier (and echo replies) on br0.mgmt."""

    OFP13 = 4
    HELLO, ERROR, ECHO_REQUEST, ECHO_REPLY, BARRIER_REQUEST, BARRIER_REPLY = 0, 1, 2, 3, 20, 21

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.xid = 0x1000
        self._send(self.HELLO, b"")
        while self._recv()[0] != self.HELLO:
            pass

    def _send(self, mtype: int, body: bytes, xid: Optional[int] = None) -> int:
        if xid is None:
            self.xid += 1
            xid = self.xid
        self.sock.sendall(struct.pack("!BBHI", self.OFP13, mtype, 8 + len(body), xid) + body)
        return xid

    def _recv(self) -> Tuple[int, int, bytes]:
        while True:
            if len(self.buf) >= 8:
                _, mtype, length, xid = struct.unpack("!BBHI", self.buf[:8])
                if len(self.buf) >= length:
                    body, self.buf = self.buf[8:length], self.buf[length:]
                    if mtype == self.ECHO_REQUEST:
                        self._send(self.ECHO_REPLY, body, xid)
                        continue
                    return mtype, xid, body
            chunk = self.sock.recv(65536)
            if not chunk:
                raise OvsError("OpenFlow connection closed")
            self.buf += chunk

    def barrier(self) -> None:
        xid = self._send(self.BARRIER_REQUEST, b"")
        while True:
            mtype, rx, body = self._recv()
            if mtype == self.BARRIER_REPLY and rx == xid:
                return
            if mtype == self.ERROR and rx == xid:
                raise OvsError(f"barrier refused: {body.hex()}")


def _pcap_records(data: bytes) -> List[bytes]:
    """Packets of a run of classic pcap records (OVS writes host-order µs pcap)."""
    out = []
    pos = 0
    while pos + 16 <= len(data):
        incl = struct.unpack("=I", data[pos + 8:pos + 12])[0]
        out.append(data[pos + 16:pos + 16 + incl])
        pos += 16 + incl
    return out


class OvsOracle:
    """A running ovs-vswitchd with one bridge and dummy ports p1..pN (ofport = index + 1)."""

    def __init__(self, ports: Sequence[str]) -> None:
        self.ports = list(ports)
        with cleanup.deferred():
            self.dir = tempfile.mkdtemp(prefix="dpu-ovs-")
            self._cleanup = cleanup.register(self._stop)
        self.env = {**os.environ, "OVS_RUNDIR": self.dir, "OVS_DBDIR": self.dir, "OVS_LOGDIR": self.dir,
                    "OVS_SYSCONFDIR": self.dir}
        self.procs: Dict[str, subprocess.Popen] = {}
        self.db = f"unix:{self.dir}/db.sock"
        self.ctl_path = f"{self.dir}/ovs-vswitchd.ctl"
        self.ctl: Optional[_Unixctl] = None
        self.of: Optional[_OpenFlow] = None
        self.offsets: Dict[str, int] = {}
        self.packets_injected = 0

    # ---- lifecycle -------------------------------------------------------------------
    def _run(self, *args: str, check: bool = True, stdin: Optional[str] = None) -> subprocess.CompletedProcess:
        self.check_alive()
        r = subprocess.run([_which(args[0]), *args[1:]], env=self.env, capture_output=True, text=True,
                           input=stdin, timeout=60)
        if check and r.returncode != 0:
            self.check_alive()
            raise OvsError(f"{' '.join(args)} failed ({r.returncode}): {r.stderr.strip()[:2000]}")
        return r

    def check_alive(self) -> None:
        """Raises (with the end of its log) if a daemon has died."""
        for name, p in self.procs.items():
            if p.poll() is not None:
                raise OvsError(f"{name} exited ({p.returncode}):\n{self.log_tail(name, 4000)}")

    def _spawn(self, name: str, *args: str) -> None:
        log = open(os.path.join(self.dir, f"{name}.out"), "w")
        with cleanup.deferred():  # known to _stop before a signal is acted on
            self.procs[name] = subprocess.Popen([_which(name), *args], env=self.env, stdout=log, stderr=log,
                                                preexec_fn=cleanup.die_with_parent, cwd=self.dir)
        log.close()

    def _wait_for(self, path: str, what: str, timeout: float = 20.0) -> None:
        end = time.monotonic() + timeout
        while not os.path.exists(path):
            for name, p in self.procs.items():
                if p.poll() is not None:
                    raise OvsError(f"{name} exited ({p.returncode}) while waiting for {what}: {self.log_tail(name)}")
            if time.monotonic() > end:
                raise OvsError(f"timed out waiting for {what}")
            time.sleep(0.02)

    def log_tail(self, name: str, n: int = 2000) -> str:
        text = ""
        for suffix in (".log", ".out"):
            p = os.path.join(self.dir, name + suffix)
            if os.path.exists(p):
                with open(p, errors="replace") as f:
                    text += f.read()[-n:]
        return text

    def start(self) -> "OvsOracle":
        d = self.dir
        schema = next(p for p in SCHEMA_PATHS if os.path.exists(p))
        self._run("ovsdb-tool", "create", f"{d}/conf.db", schema)
        self._spawn("ovsdb-server", f"{d}/conf.db", f"--remote=punix:{d}/db.sock",
                    f"--unixctl={d}/ovsdb-server.ctl", f"--log-file={d}/ovsdb-server.log",
                    "--no-chdir", "-vconsole:off")
        self._wait_for(f"{d}/db.sock", "ovsdb-server")
        self._run("ovs-vsctl", f"--db={self.db}", "--no-wait", "init")
        self._spawn("ovs-vswitchd", self.db, f"--unixctl={self.ctl_path}", f"--log-file={d}/ovs-vswitchd.log",
                    "--enable-dummy=override", "--disable-system", "--disable-system-route", "--no-chdir",
                    "-vconsole:off")
        self._wait_for(self.ctl_path, "ovs-vswitchd")
        cmd = ["ovs-vsctl", f"--db={self.db}", "--timeout=30", "--", "add-br", BRIDGE, "--", "set", "bridge", BRIDGE,
               "datapath_type=netdev", "fail_mode=secure", "protocols=OpenFlow13"]
        for i, name in enumerate(self.ports):
            cmd += ["--", "add-port", BRIDGE, name, "--", "set", "interface", name, "type=dummy",
                    f"ofport_request={i + 1}", f"options:tx_pcap={d}/{name}-tx.pcap"]
        self._run(*cmd)
        self._wait_for(f"{d}/{BRIDGE}.mgmt", "the bridge's management socket")
        for name in self.ports:
            self._wait_for(f"{d}/{name}-tx.pcap", f"{name}'s tx pcap")
        numbers = self._run("ovs-vsctl", f"--db={self.db}", "--columns=name,ofport", "--format=csv", "--no-headings",
                            "list", "interface").stdout
        got = dict(line.split(",") for line in numbers.split())
        for i, name in enumerate(self.ports):
            if got.get(name) != str(i + 1):
                raise OvsError(f"port {name} got OpenFlow number {got.get(name)}, wanted {i + 1}")
        self.ctl = _Unixctl(self.ctl_path)
        self.of = _OpenFlow(f"{d}/{BRIDGE}.mgmt")
        self.of.barrier()
        for name in self.ports:
            self.offsets[name] = os.path.getsize(self._pcap(name))
        return self

    def stop(self) -> None:
        self._cleanup.run()

    def _stop(self) -> None:
        for c in (self.ctl, self.of):
            if c is not None:
                try:
                    c.close()
                except OSError:
                    pass
        for name in ("ovs-vswitchd", "ovsdb-server"):
            p = self.procs.get(name)
            if p is None or p.poll() is not None:
                continue
            os.kill(p.pid, signal.SIGTERM)
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(p.pid, signal.SIGKILL)
                p.wait(timeout=10)
        if not os.environ.get("DPU_OVS_KEEP"):  # DPU_OVS_KEEP=1 keeps the logs and pcaps
            shutil.rmtree(self.dir, ignore_errors=True)

    def _pcap(self, port: str) -> str:
        return f"{self.dir}/{port}-tx.pcap"

    # ---- configuration ---------------------------------------------------------------
    def ofctl(self, *args: str, check: bool = True, stdin: Optional[str] = None) -> subprocess.CompletedProcess:
        return self._run("ovs-ofctl", "-O", "OpenFlow13", *args, check=check, stdin=stdin)

    def clear(self) -> None:
        self.ofctl("del-flows", BRIDGE)
        self.ofctl("del-groups", BRIDGE)

    def set_frags(self, mode: str) -> None:
        """ovs-ofctl set-frags: "normal" (OVS's default) or "nx-match"."""
        self.ofctl("set-frags", BRIDGE, mode)
        self.purge()

    def load(self, flows: Sequence[str], groups: Sequence[str] = ()) -> None:
        """Replaces the bridge's flows and groups; raises OvsError (with ovs-ofctl's
        message) if ovs-ofctl or the switch refuses any of them."""
        self.clear()
        if groups:
            self._load_file("add-groups", groups)
        if flows:
            self._load_file("add-flows", flows)
        self.purge()

    def _load_file(self, cmd: str, lines: Sequence[str]) -> None:
        path = os.path.join(self.dir, cmd + ".txt")
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")
        self.ofctl(cmd, BRIDGE, path)

    def load_accepted(self, flows: Sequence[str], groups: Sequence[str] = ()) -> Tuple[List[str], List[str]]:
        """Loads what ovs-ofctl and the switch accept of ``groups`` and ``flows`` and
        returns (flows, groups) accepted, in the order given. Every flow must carry a
        cookie of its own (that is how accepted flows are found in dump-flows); a
        group is identified by its group_id."""
        self.clear()
        ok_groups = self._add_each("add-groups", groups)
        present = set(self._group_ids())
        ok_groups = [g for g in ok_groups if _group_id(g) in present]
        ok_flows = self._add_each("add-flows", flows)
        cookies = self._cookies()
        ok_flows = [f for f in ok_flows if _cookie(f) in cookies]
        self.purge()
        return ok_flows, ok_groups

    def _add_each(self, cmd: str, lines: Sequence[str]) -> List[str]:
        """Sends ``lines`` in one ovs-ofctl call; when ovs-ofctl refuses the file (a
        line it cannot parse or encode for OpenFlow 1.3 aborts the whole call), each
        half is sent on its own, down to single lines, keeping the order. What the
        switch itself refuses (a flow to a missing group, ...) is found by the
        caller in the dump."""
        lines = list(lines)
        if not lines:
            return []
        path = os.path.join(self.dir, cmd + ".txt")
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")
        r = self.ofctl(cmd, BRIDGE, path, check=False)
        if r.returncode == 0 or "OFPT_ERROR" in r.stderr:
            return lines  # sent; refusals by the switch show in the dump
        if len(lines) == 1:
            return []
        half = len(lines) // 2
        return self._add_each(cmd, lines[:half]) + self._add_each(cmd, lines[half:])

    def _cookies(self) -> set:
        out = self.ofctl("dump-flows", BRIDGE).stdout
        cookies = set()
        for line in out.splitlines():
            line = line.strip()
            if line.startswith("cookie="):
                cookies.add(int(line.split(",", 1)[0].split("=")[1], 0))
        return cookies

    def _group_ids(self) -> List[int]:
        out = self.ofctl("dump-groups", BRIDGE).stdout
        return [int(line.strip().split(",", 1)[0].split("=")[1]) for line in out.splitlines()
                if line.strip().startswith("group_id=")]

    def purge(self) -> None:
        """Empties the datapath flow cache, so that the next packet is translated
        with the tables as they are now."""
        assert self.ctl is not None
        self.ctl.call("revalidator/purge")

    # ---- packets ---------------------------------------------------------------------
    def send(self, port: str, data: bytes, fresh: bool = True) -> Dict[str, List[bytes]]:
        """Injects one frame on ``port``; returns what each port sent because of it.

        ``fresh``: the datapath flow cache is emptied first, so the packet is
        translated on its own. OVS 3.1's megaflows are not always exact: a set
        action whose translation checked nw_proto (commit_set_nw_action skips
        L3 writes when it is 0) does not put nw_proto in the megaflow, so a
        malformed IPv4 packet that shares a valid packet's megaflow gets a write
        its own translation would not have. The oracle is OVS's translation,
        not its cache history."""
        assert self.ctl is not None and self.of is not None
        if len(data) < 14:
            raise ValueError("netdev-dummy/receive needs at least an Ethernet header")
        try:
            if fresh:
                self.ctl.call("revalidator/purge")
            before = self.lookups()
            self.ctl.call("netdev-dummy/receive", port, data.hex())
            self.of.barrier()
            self._wait_for_lookup(before)
        except (OSError, OvsError):
            self.check_alive()
            raise
        self.packets_injected += 1
        return self.collect()

    def lookups(self) -> int:
        """The datapath's lookups so far (hit + missed + lost, from dpctl/show)."""
        assert self.ctl is not None
        text = self.ctl.call("dpctl/show")
        m = re.search(r"lookups: hit:(\d+) missed:(\d+) lost:(\d+)", text)
        if not m:
            raise OvsError(f"dpctl/show has no lookups line: {text[:300]}")
        return sum(int(g) for g in m.groups())

    def _wait_for_lookup(self, before: int, timeout: float = 30.0) -> None:
        """Waits until the datapath has looked the injected packet up. A barrier's
        reply does not wait for the datapath: a translation of thousands of
        resubmits on a loaded machine has written its output after it. dpif-netdev
        counts a miss after the upcall's actions have run (fast_path_processing),
        so once the count moves the packet's output is in the pcap files."""
        end = time.monotonic() + timeout
        pause = 0.0005
        while self.lookups() <= before:
            if time.monotonic() > end:
                raise OvsError(f"the datapath did not look the packet up within {timeout:.0f} s")
            time.sleep(pause)
            pause = min(pause * 2, 0.05)

    def collect(self) -> Dict[str, List[bytes]]:
        out: Dict[str, List[bytes]] = {}
        for name in self.ports:
            path = self._pcap(name)
            size = os.path.getsize(path)
            if size == self.offsets[name]:
                continue
            with open(path, "rb") as f:
                f.seek(self.offsets[name])
                chunk = f.read(size - self.offsets[name])
            self.offsets[name] = size
            recs = _pcap_records(chunk)
            if recs:
                out[name] = recs
        return out

    def run(self, packets: Sequence[Tuple[str, bytes]]) -> List[Dict[str, List[bytes]]]:
        return [self.send(p, d) for p, d in packets]

    def trace(self, port: str, data: bytes) -> str:
        """ofproto/trace of a packet (for failure messages)."""
        assert self.ctl is not None
        try:
            return self.ctl.call("ofproto/trace", BRIDGE, f"in_port={self.ports.index(port) + 1}", data.hex())
        except OvsError as e:
            return str(e)


def _cookie(flow: str) -> Optional[int]:
    for item in flow.split(","):
        item = item.strip()
        if item.startswith("cookie="):
            return int(item[len("cookie="):].split("/")[0], 0)
    return None


def _group_id(group: str) -> int:
    return int(group.split(",", 1)[0].split("=")[1], 0)
