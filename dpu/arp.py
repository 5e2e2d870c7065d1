"""Next-hop resolution for ``dpu run``: ARP for the underlay and internet
routers whose MAC address the topology leaves out (``nexthop:`` instead of
``nexthop_mac:``).

Until a next hop answers, what would go to it is dropped and counted
(``nexthop_unresolved``). When it answers, the topology is recompiled with its
MAC address in one transaction (the tunnel header and the internet route
change together); every ``refresh`` seconds it is asked again, by unicast as
Linux does for a stale entry, and a next hop that leaves three questions in a
row unanswered is unresolved again. A reply, a request from the next hop
itself, or a gratuitous ARP all tell its address (RFC 826's merge step).

The resolver has its own AF_PACKET socket per interface (ETH_P_ARP only): the
kernel hands every socket its copy, so the workers' traffic is untouched.
"""
from __future__ import annotations

import ipaddress
import logging
import select
import socket
import struct
import threading
import time
from dataclasses import dataclass
from typing import Dict, List, Optional

log = logging.getLogger("dpu.arp")

ETH_P_ARP = 0x0806
PACKET_OUTGOING = 4
BROADCAST = b"\xff" * 6
MAX_UNANSWERED = 3
RETRY_S = 1.0


def mac_bytes(mac: str) -> bytes:
    return bytes.fromhex(mac.replace(":", ""))


def mac_text(b: bytes) -> str:
    return ":".join(f"{x:02x}" for x in b)


def arp_request(src_mac: str, src_ip, target_ip, dst: bytes = BROADCAST) -> bytes:
    """An Ethernet ARP request (who-has target_ip, tell src_ip), padded to 60 bytes."""
    sm = mac_bytes(src_mac)
    body = struct.pack("!HHBBH6s4s6s4s", 1, 0x0800, 6, 4, 1, sm, ipaddress.IPv4Address(src_ip).packed,
                       b"\0" * 6, ipaddress.IPv4Address(target_ip).packed)
    return (dst + sm + struct.pack("!H", ETH_P_ARP) + body).ljust(60, b"\0")


def parse_arp(frame: bytes) -> Optional[tuple]:
    """(op, sender MAC, sender IP, target IP) of an Ethernet/IPv4 ARP frame, else None."""
    if len(frame) < 42 or frame[12:14] != b"\x08\x06":
        return None
    htype, ptype, hlen, plen, op = struct.unpack("!HHBBH", frame[14:22])
    if htype != 1 or ptype != 0x0800 or hlen != 6 or plen != 4:
        return None
    sha, spa, tpa = frame[22:28], frame[28:32], frame[38:42]
    return op, mac_text(sha), str(ipaddress.IPv4Address(spa)), str(ipaddress.IPv4Address(tpa))


@dataclass
class NextHop:
    which: str                 # "uplink" or "internet"
    ifname: str
    ip: str
    src_ip: str
    src_mac: str
    mac: Optional[str] = None
    unanswered: int = 0
    next_probe: float = 0.0
    requests: int = 0
    replies: int = 0
    sock: Optional[socket.socket] = None

    def state(self) -> str:
        if self.mac is None:
            return "unresolved"
        return "probing" if self.unanswered else "resolved"


class Resolver:
    def __init__(self, inst, hops: List[NextHop], refresh: float) -> None:
        self.inst = inst
        self.hops = hops
        self.refresh = refresh
        self._stop = threading.Event()
        self._mu = threading.Lock()
        for h in hops:
            h.sock = self._open(h.ifname)
        self.thread = threading.Thread(target=self._loop, name="dpu-arp", daemon=True)

    @classmethod
    def for_topology(cls, inst) -> Optional["Resolver"]:
        topo = inst.topology
        if topo is None:
            return None
        hops = cls._targets(inst, topo)
        return cls(inst, hops, inst.opts.arp_refresh_s) if hops else None

    @staticmethod
    def _targets(inst, topo) -> List[NextHop]:
        hops = []
        u = topo.uplink
        if u.nexthop_mac is None and u.port in inst.attached:
            hops.append(NextHop("uplink", inst.attached[u.port], str(u.nexthop), str(u.ip), u.mac))
        i = topo.internet
        if i is not None and i.nexthop_mac is None and i.port in inst.attached:
            src = i.ip
            if src is None:
                pubs = [a for t in topo.tenants.values() if t.nat for a in t.nat.public_addresses]
                src = pubs[0] if pubs else ipaddress.IPv4Address("0.0.0.0")
            hops.append(NextHop("internet", inst.attached[i.port], str(i.nexthop), str(src), i.mac))
        return hops

    @staticmethod
    def _open(ifname: str) -> socket.socket:
        s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ARP))
        s.bind((ifname, ETH_P_ARP))
        s.setblocking(False)
        return s

    def retarget(self) -> None:
        """After a reload: follow the topology's next hops (new IPs start unresolved)."""
        new = self._targets(self.inst, self.inst.topology)
        with self._mu:
            old = {(h.which, h.ifname, h.ip): h for h in self.hops}
            keep = []
            for h in new:
                o = old.pop((h.which, h.ifname, h.ip), None)
                if o is not None:
                    o.src_ip, o.src_mac = h.src_ip, h.src_mac
                    keep.append(o)
                else:
                    h.sock = self._open(h.ifname)
                    keep.append(h)
            for o in old.values():
                o.sock.close()
                self.inst.resolved.pop(o.which, None)
            self.hops = keep

    def start(self) -> None:
        self.thread.start()

    def close(self) -> None:
        self._stop.set()
        if self.thread.is_alive():
            self.thread.join(timeout=2)
        for h in self.hops:
            if h.sock is not None:
                h.sock.close()

    def status(self) -> Dict[str, dict]:
        with self._mu:
            return {h.which: {"ip": h.ip, "mac": h.mac, "state": h.state(), "interface": h.ifname,
                              "requests": h.requests, "replies": h.replies} for h in self.hops}

    # ---- the loop ------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.is_set():
            now = time.monotonic()
            with self._mu:
                hops = list(self.hops)
            for h in hops:
                if now >= h.next_probe:
                    self._probe(h, now)
            socks = [h.sock for h in hops]
            try:
                ready, _, _ = select.select(socks, [], [], 0.2)
            except (OSError, ValueError):
                ready = []
            for s in ready:
                self._receive(s, hops)

    def _probe(self, h: NextHop, now: float) -> None:
        if h.mac is not None and h.unanswered >= MAX_UNANSWERED:
            h.mac = None  # gone: its traffic is dropped (counted) until it answers again
            self._publish(h)
        frame = arp_request(h.src_mac, h.src_ip, h.ip, dst=mac_bytes(h.mac) if h.mac else BROADCAST)
        try:
            h.sock.send(frame)
            h.requests += 1
        except OSError:
            pass  # interface down: try again later
        if h.mac is not None:
            h.unanswered += 1
        h.next_probe = now + (RETRY_S if h.mac is None or h.unanswered > 1 else self.refresh)

    def _receive(self, s: socket.socket, hops: List[NextHop]) -> None:
        while True:
            try:
                frame, addr = s.recvfrom(2048)
            except (BlockingIOError, OSError):
                return
            if len(addr) > 2 and addr[2] == PACKET_OUTGOING:
                continue
            a = parse_arp(frame)
            if a is None:
                continue
            _, sha, spa, _ = a
            for h in hops:
                if h.sock is s and spa == h.ip and not (int(sha[:2], 16) & 1) and sha != "00:00:00:00:00:00":
                    h.replies += 1
                    h.unanswered = 0
                    h.next_probe = time.monotonic() + self.refresh
                    if h.mac != sha:
                        h.mac = sha
                        self._publish(h)

    def _publish(self, h: NextHop) -> None:
        try:
            self.inst.set_resolved(h.which, h.mac)
        except Exception as e:  # noqa: BLE001 - keep resolving; say why this one did not apply
            log.warning("next hop %s %s: %s", h.which, h.ip, e, extra={"nexthop": h.which})
