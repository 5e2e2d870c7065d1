"""A small cloud in network namespaces for the live-mode tests (`dpu run`).

    vm1 ns ──┐                                   ┌── rblue ns (10.0.0.21, blue's remote endpoint)
    vm2 ns ──┼── dpu ns ── p0 ══ vtep ns ════════┤   br100 + vxlan100 (local 192.0.2.2, VNI 100)
    vm3 ns ──┘   (dpu run)        (Linux vxlan)  └── rred ns  (10.0.0.21, red's remote endpoint)
                      └── inet ══ inet ns             br200 + vxlan200 (local 192.0.2.3, VNI 200)
                                  (router 198.51.100.254, server 198.51.100.1)

Every address lives in a namespace this lab creates (the machine's own network
may use the same documentation ranges); `close()` ends every process in them
and deletes them all, which destroys every interface in them; so do an exit
and SIGTERM, SIGINT or SIGHUP (dpu.cleanup), in the test process as in any
tool that builds a lab. dpu runs inside the dpu namespace and needs no
address there. The VMs and remote endpoints have the MACs and addresses of
examples/nat-gateway.yaml; the topology is written with the lab's next hops.
"""
from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import time

import yaml

from dpu import cleanup
from netns import ip, netns_add, nsexec, remove_namespaces, sh, sysctl

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PEER = os.path.join(HERE, "live_peer.py")
EXAMPLE = os.path.join(ROOT, "examples", "nat-gateway.yaml")
_counter = itertools.count()

VTEP_MAC = "02:00:00:00:00:02"       # the underlay next hop: the remote VTEP host itself
INET_ROUTER_MAC = "02:00:00:00:00:32"
ROUTER_IP, SERVER_IP = "198.51.100.254", "198.51.100.1"
VMS = {  # port: (tenant, mac, ip/prefix, gateway)
    "vm1": ("blue", "02:00:00:00:01:11", "10.0.0.11/24", "10.0.0.1"),
    "vm2": ("blue", "02:00:00:00:01:12", "10.0.1.12/24", "10.0.1.1"),
    "vm3": ("red", "02:00:00:00:03:11", "10.0.0.11/24", "10.0.0.1"),
}
REMOTES = {  # tenant: (vni, local vtep, mac, ip/prefix)
    "blue": (100, "192.0.2.2", "02:00:00:00:02:21", "10.0.0.21/24"),
    "red": (200, "192.0.2.3", "02:00:00:00:03:21", "10.0.0.21/24"),
}


def _quiet(ns: str) -> None:
    """No IPv6 chatter (router solicitations, MLD) in a test namespace."""
    for scope in ("default", "all"):
        sysctl(ns, f"net.ipv6.conf.{scope}.disable_ipv6", 1, check=False)


def skip_unless_live() -> None:
    """Skips the calling test module (call it at its top) where the lab cannot be built."""
    import shutil

    import pytest

    if os.geteuid() != 0:
        pytest.skip("live tests need root (network namespaces, AF_PACKET)", allow_module_level=True)
    if not shutil.which("ethtool") or not shutil.which("ping"):
        pytest.skip("live tests need ethtool and ping (apt-get install ethtool iputils-ping)", allow_module_level=True)


def module_lab(name: str):
    """A module-scoped `lab` fixture (``lab = module_lab("views")`` in a test module): one
    Lab for the module's tests, closed after them, leaving nothing behind."""
    import pytest

    @pytest.fixture(scope="module")
    def lab(tmp_path_factory):
        lab = Lab(str(tmp_path_factory.mktemp(name)))
        yield lab
        lab.close()
        assert lab.leftovers() == []

    return lab


class Lab:
    def __init__(self, tmp: str, underlay_mtu: int = 1500):
        n = next(_counter)
        self.tag = f"dpl{os.getpid() % 100000}{n}"
        self.tmp = tmp
        self.ns = {k: f"{self.tag}-{k}" for k in ("dpu", "vm1", "vm2", "vm3", "vtep", "rblue", "rred", "inet")}
        self.procs: list[subprocess.Popen] = []
        self._cleanup = cleanup.register(self._remove)  # before anything exists: a signal finds all of it
        try:
            self._build(underlay_mtu)
        except BaseException:
            self.close()
            raise

    # ---- building -------------------------------------------------------------------------
    def _build(self, underlay_mtu: int) -> None:
        self.underlay_mtu = underlay_mtu
        mtu = underlay_mtu - 50  # the overlay: what VXLAN leaves of the underlay's MTU
        for ns in self.ns.values():
            netns_add(ns)
            ip(ns, "link", "set", "lo", "up")
            _quiet(ns)
        d = self.ns["dpu"]
        for port, (_, mac, addr, gw) in VMS.items():
            v = self.ns[port]
            self._veth(d, port, v, "eth0", mac, mtu)
            ip(v, "addr", "add", addr, "dev", "eth0")
            ip(v, "route", "add", "default", "via", gw)
        # the underlay: dpu's p0 to the VTEP host
        self._veth(d, "p0", self.ns["vtep"], "eth0", VTEP_MAC, underlay_mtu)
        vt = self.ns["vtep"]
        # A NIC puts segmented frames on a wire; a veth would hand dpu the vxlan device's 64 KB
        # super-frames, which AF_PACKET cannot describe (TCP super-frames it can: dpu cuts those).
        nsexec(vt, "ethtool", "-K", "eth0", "tx-udp_tnl-segmentation", "off", "tx-udp_tnl-csum-segmentation", "off")
        for tenant, (vni, local, mac, addr) in REMOTES.items():
            ip(vt, "addr", "add", f"{local}/24", "dev", "eth0")
            ip(vt, "link", "add", f"vx{vni}", "mtu", str(mtu), "type", "vxlan", "id", str(vni), "local",
               local, "dstport", "4789", "nolearning", "noudpcsum")
            sh("bridge", "-n", vt, "fdb", "append", "00:00:00:00:00:00", "dev", f"vx{vni}", "dst", "192.0.2.1")
            ip(vt, "link", "add", f"br{vni}", "type", "bridge")
            ip(vt, "link", "set", f"vx{vni}", "master", f"br{vni}")
            r = self.ns["r" + tenant]
            self._veth(vt, f"h{vni}", r, "eth0", mac, mtu)
            ip(vt, "link", "set", f"h{vni}", "master", f"br{vni}")
            for dev in (f"vx{vni}", f"br{vni}"):
                ip(vt, "link", "set", dev, "up")
            ip(r, "addr", "add", addr, "dev", "eth0")
        # the internet
        i = self.ns["inet"]
        self._veth(d, "inet", i, "eth0", INET_ROUTER_MAC, 1500)
        ip(i, "addr", "add", f"{ROUTER_IP}/24", "dev", "eth0")
        ip(i, "addr", "add", f"{SERVER_IP}/24", "dev", "eth0")
        ip(i, "route", "add", "203.0.113.0/24", "dev", "eth0")  # public addresses: on the link, dpu answers ARP

    def _veth(self, ns_a: str, a: str, ns_b: str, b: str, mac_b: str, mtu: int) -> None:
        self._veth_add(ns_a, a, ns_b, b, mac_b, mtu)
        ip(ns_a, "link", "set", a, "up")
        ip(ns_b, "link", "set", b, "up")

    def _veth_add(self, ns_a: str, a: str, ns_b: str, b: str, mac_b: str, mtu: int, at: tuple = ()) -> None:
        """The pair, both ends down (`at`: options of the first end, e.g. its index)."""
        sh("ip", "link", "add", "name", a, *at, "netns", ns_a, "mtu", str(mtu), "type", "veth", "peer", "name", b,
           "netns", ns_b, "address", mac_b, "mtu", str(mtu))

    def remake_vm(self, port: str, index: int = 0, setup=None, delete: bool = True) -> None:
        """A VM's interface deleted (unless the caller did) and made again as _build made it (a
        VM restarting), under another name first, so that dpu meets it whole: `setup(ns, dev)`
        runs on dpu's end before it takes the port's name; `index` asks for that ifindex."""
        _, mac, addr, gw = VMS[port]
        d, v = self.ns["dpu"], self.ns[port]
        if delete:
            ip(d, "link", "del", port)
        tmp = port + "new"
        self._veth_add(d, tmp, v, "eth0", mac, self.underlay_mtu - 50, ("index", str(index)) if index else ())
        if setup:
            setup(d, tmp)
        ip(d, "link", "set", tmp, "name", port)
        ip(d, "link", "set", port, "up")
        ip(v, "link", "set", "eth0", "up")
        ip(v, "addr", "add", addr, "dev", "eth0")
        ip(v, "route", "add", "default", "via", gw)

    def topology(self, **changes) -> str:
        """examples/nat-gateway.yaml with the lab's next hops, written to a file; `changes`
        ("uplink"/"internet" dicts) are merged in (None deletes a key)."""
        with open(EXAMPLE) as f:
            t = yaml.safe_load(f)
        for section, kv in changes.items():
            for k, v in kv.items():
                if v is None:
                    t[section].pop(k, None)
                else:
                    t[section][k] = v
        t["uplink"].setdefault("mtu", self.underlay_mtu)
        path = os.path.join(self.tmp, f"topo-{next(_counter)}.yaml")
        with open(path, "w") as f:
            yaml.safe_dump(t, f)
        return path

    # ---- running dpu --------------------------------------------------------------------
    def start_dpu(self, topo: str | None = None, workers: int = 1, extra: tuple = (), wait: bool = True,
                  prefix: tuple = ()) -> "Dpu":
        """`prefix`: a command that runs dpu in its place (exec), e.g. ("prlimit", "--nofile=64:4096")."""
        topo = topo or self.topology()
        ctl = os.path.join(self.tmp, f"dpu-{next(_counter)}.ctl")
        args = ["--config", topo, "--workers", str(workers), "--ctl", ctl]
        for port in ("vm1", "vm2", "vm3", "p0", "inet"):
            args += ["--port", f"{port}={port}"]
        return Dpu(self, args + list(extra), ctl, wait, prefix)

    def run_dpu(self, *args: str, timeout: float = 30) -> subprocess.CompletedProcess:
        """`dpu run ...` in the dpu namespace, expected to exit by itself (errors)."""
        return subprocess.run(["ip", "netns", "exec", self.ns["dpu"], sys.executable, "-m", "dpu.cli", "run", *args],
                              capture_output=True, text=True, timeout=timeout, cwd=ROOT)

    # ---- traffic --------------------------------------------------------------------------
    def peer(self, where: str, *args: str) -> subprocess.Popen:
        """live_peer.py in a namespace; returns once it listens (servers) or at once (clients)."""
        p = subprocess.Popen(["ip", "netns", "exec", self.ns[where], sys.executable, PEER, *args],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             preexec_fn=cleanup.die_with_parent)
        self.procs.append(p)
        if args[0] in ("sink", "udp-echo", "whoami"):
            line = p.stdout.readline()
            assert line.strip() == "listening", (line, p.stderr.read() if p.poll() is not None else "")
        return p

    def transfer(self, server: str, client: str, dst: str, port: int, nbytes: int, timeout: float = 90) -> str:
        """A TCP stream of nbytes from client to server (dst:port); returns the address the server
        saw. Fails unless the server received exactly what was sent."""
        srv = self.peer(server, "sink", str(port))
        cli = self.peer(client, "source", dst, str(port), str(nbytes))
        return self.finish(srv, cli, timeout)

    def start_transfer(self, server: str, client: str, dst: str, port: int, nbytes: int, rate: int):
        """A transfer that takes a while (rate bytes/s); returns once connected. finish() checks it."""
        srv = self.peer(server, "sink", str(port))
        cli = self.peer(client, "source", dst, str(port), str(nbytes), str(rate))
        line = cli.stdout.readline()
        assert line.strip() == "connected", (line, cli.stderr.read() if cli.poll() is not None else "")
        return srv, cli

    def finish(self, srv, cli, timeout: float = 90) -> str:
        out, err = cli.communicate(timeout=timeout)
        last = out.strip().splitlines()[-1] if out.strip() else ""
        assert last.startswith("ok "), f"transfer failed: {out} {err}"
        sout, serr = srv.communicate(timeout=10)
        assert sout.strip().endswith(last.split()[1]), (sout, serr)
        return sout.split()[1].rsplit(":", 1)[0]

    def ping(self, where: str, dst: str, count: int = 3, size: int = 56, df: bool = False) -> bool:
        args = ["ping", "-c", str(count), "-i", "0.2", "-W", "1", "-s", str(size)]
        if df:
            args += ["-M", "do"]
        r = nsexec(self.ns[where], *args, dst, check=False)
        return r.returncode == 0

    def udp_ask(self, where: str, dst: str, port: int, text: str) -> str:
        r = nsexec(self.ns[where], sys.executable, PEER, "udp-ask", dst, str(port), text, check=False)
        return r.stdout.strip()

    def close(self) -> None:
        self._cleanup.run()
        for p in self.procs:  # reaped, their pipes closed
            with contextlib.suppress(Exception):
                p.communicate(timeout=5)

    def _remove(self) -> None:
        """The processes this lab started and every other one in its namespaces, then the
        namespaces: close(), or dpu.cleanup when the process ends without it."""
        for p in self.procs:
            if p.poll() is None:
                p.kill()
        remove_namespaces(*self.ns.values())

    def leftovers(self) -> list[str]:
        """This lab's namespaces that still exist."""
        have = sh("ip", "netns", "list", check=False).stdout
        return [ns for ns in self.ns.values() if ns in have]


class Dpu:
    """`dpu run` as a child process in the lab's dpu namespace."""

    def __init__(self, lab: Lab, args: list, ctl: str, wait: bool, prefix: tuple = ()):
        self.lab, self.ctl = lab, ctl
        self.proc = subprocess.Popen(
            [*prefix, "ip", "netns", "exec", lab.ns["dpu"], sys.executable, "-m", "dpu.cli", "run", *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, preexec_fn=cleanup.die_with_parent)
        lab.procs.append(self.proc)
        self.stderr_lines: list[str] = []
        if wait:
            self.wait_ready()

    def wait_ready(self, timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        while True:
            line = self.proc.stderr.readline()
            if not line:
                out, err = self.proc.communicate(timeout=5)
                raise AssertionError(f"dpu run exited ({self.proc.returncode}): {''.join(self.stderr_lines)}{err}")
            self.stderr_lines.append(line)
            if " dpu: info: forwarding on " in line:  # after the record's time (dpu/logs.py)
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"dpu run did not start: {self.stderr_lines}")

    def ctl_cmd(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        """A dpu CLI command against this instance (from the root namespace: the socket is a file)."""
        r = subprocess.run([sys.executable, "-m", "dpu.cli", *args, "--ctl", self.ctl], capture_output=True,
                           text=True, timeout=60, cwd=ROOT)
        if check and r.returncode != 0:
            raise AssertionError(f"dpu {' '.join(args)}: {r.returncode} {r.stdout} {r.stderr}")
        return r

    def stats(self) -> dict:
        return json.loads(self.ctl_cmd("stats", "--json").stdout)

    def metrics(self, url: str) -> str:
        # the metrics address is in the dpu namespace: fetch from there
        r = nsexec(self.lab.ns["dpu"], sys.executable, "-c",
                   f"import urllib.request;print(urllib.request.urlopen({url!r}, timeout=5).read().decode())")
        return r.stdout

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> tuple[int, str, str]:
        self.proc.send_signal(sig)
        out, err = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, out, "".join(self.stderr_lines) + err


__all__ = ["Lab", "Dpu", "VMS", "REMOTES", "ROUTER_IP", "SERVER_IP", "INET_ROUTER_MAC", "VTEP_MAC", "module_lab",
           "skip_unless_live"]
