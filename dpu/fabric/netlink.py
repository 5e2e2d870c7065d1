"""rtnetlink in a network namespace, for the fabric mirror (docs/fabric.md).

The kernel shadow lives in namespaces other than dpu's own (one per tenant with FRR's netns
VRF backend), so every socket here is made by the calling thread after `setns()` into the
namespace, and stays bound to it after the thread returns (a netlink socket belongs to the
namespace it was created in). Nothing forks: pyroute2's own netns support does, and a forked
child inherits whatever lab or daemon its parent owns (tests/EVPN_LAB.md, "Events").

- :class:`Rtnl` is one NETLINK_ROUTE socket: :meth:`Rtnl.dump` (links, bridge FDB, IPv4
  neighbours, IPv4 routes; retried when the kernel flags a dump interrupted by a change),
  :meth:`Rtnl.neigh` (add, replace or delete one FDB entry or neighbour, acknowledged; a
  refusal raises OSError with the kernel's errno and extended-ack text), and, bound to
  multicast groups, :meth:`Rtnl.events` (what is waiting, without blocking).
- Requests are packed here (an ndmsg and two attributes). What the kernel sends is parsed
  here for the bulk of it, neighbours/FDB entries and routes (`Neigh`, `Route`: a 10,000-MAC
  fabric is tens of thousands of them, and pyroute2's generic parser costs ~100 us each), and
  by pyroute2's marshal for the rest (links, addresses: its message classes only, no
  pyroute2 sockets). Both kinds answer the same questions: m["field"], m.get_attr("NAME"),
  m.get("event"), m["header"].

One Rtnl is used by one thread at a time; make one per thread and namespace.
"""
from __future__ import annotations

import contextlib
import ctypes
import errno
import ipaddress
import os
import socket
import struct
from typing import Iterator, List, Optional

_CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)

# netlink(7), rtnetlink(7)
NLM_F_REQUEST, NLM_F_MULTI, NLM_F_ACK = 0x1, 0x2, 0x4
NLM_F_DUMP_INTR = 0x10
NLM_F_ROOT, NLM_F_MATCH = 0x100, 0x200
NLM_F_DUMP = NLM_F_ROOT | NLM_F_MATCH
NLM_F_REPLACE, NLM_F_EXCL, NLM_F_CREATE = 0x100, 0x200, 0x400
NLM_F_CAPPED, NLM_F_ACK_TLVS = 0x100, 0x200          # flags of an NLMSG_ERROR
NLMSG_ERROR, NLMSG_DONE = 2, 3
NLMSGERR_ATTR_MSG = 1
SOL_NETLINK, NETLINK_EXT_ACK = 270, 11
SO_RCVBUFFORCE = 33
RTM_NEWLINK, RTM_DELLINK, RTM_GETLINK = 16, 17, 18
RTM_GETADDR = 22
RTM_NEWROUTE, RTM_DELROUTE, RTM_GETROUTE = 24, 25, 26
RTM_NEWNEIGH, RTM_DELNEIGH, RTM_GETNEIGH = 28, 29, 30
RTMGRP_LINK, RTMGRP_NEIGH, RTMGRP_IPV4_ROUTE = 0x1, 0x4, 0x40
NDA_DST, NDA_LLADDR, NDA_MASTER = 1, 2, 9
RTA_DST, RTA_OIF, RTA_GATEWAY, RTA_PRIORITY, RTA_MULTIPATH, RTA_TABLE = 1, 4, 5, 6, 9, 15
_ROUTE_U32 = {RTA_OIF: "RTA_OIF", RTA_PRIORITY: "RTA_PRIORITY", RTA_TABLE: "RTA_TABLE"}   # u32 route attributes
NTF_SELF, NTF_MASTER, NTF_EXT_LEARNED = 0x02, 0x04, 0x10
NUD_REACHABLE, NUD_FAILED, NUD_NOARP, NUD_PERMANENT = 0x02, 0x20, 0x40, 0x80
RTPROT_BGP = 186
RT_TABLE_MAIN = 254
IFF_UP, IFF_RUNNING, IFF_LOWER_UP = 0x1, 0x40, 0x10000
ZERO_MAC = "00:00:00:00:00:00"

# RTM_GET* dump requests: message type and the family header (ifinfomsg, ndmsg, rtmsg).
_DUMPS = {"links": (RTM_GETLINK, struct.pack("=BxHiII", socket.AF_UNSPEC, 0, 0, 0, 0)),
          "fdb": (RTM_GETNEIGH, struct.pack("=BxxxiHBB", socket.AF_BRIDGE, 0, 0, 0, 0)),
          "neighbours": (RTM_GETNEIGH, struct.pack("=BxxxiHBB", socket.AF_INET, 0, 0, 0, 0)),
          "addresses": (RTM_GETADDR, struct.pack("=BBBBI", socket.AF_INET, 0, 0, 0, 0)),
          "routes": (RTM_GETROUTE, struct.pack("=BBBBBBBBI", socket.AF_INET, 0, 0, 0, 0, 0, 0, 0, 0))}


@contextlib.contextmanager
def in_netns(ns: Optional[str]) -> Iterator[None]:
    """Runs the block with this thread in network namespace `ns` (a name under /run/netns, or
    an absolute path to a namespace file such as /proc/PID/ns/net; None: stay). Sockets made in
    the block stay in `ns`."""
    if ns is None:
        yield
        return
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        try:
            target = os.open(ns if ns.startswith("/") else f"/run/netns/{ns}", os.O_RDONLY)
        except FileNotFoundError:
            raise OSError(errno.ENOENT, f"network namespace {ns!r} does not exist") from None
        try:
            if _libc.setns(target, _CLONE_NEWNET) != 0:
                e = ctypes.get_errno()
                raise OSError(e, f"setns into network namespace {ns!r}: {os.strerror(e)}")
        finally:
            os.close(target)
        try:
            yield
        finally:
            if _libc.setns(own, _CLONE_NEWNET) != 0:     # never leave the thread elsewhere
                e = ctypes.get_errno()
                raise OSError(e, f"setns back from {ns!r}: {os.strerror(e)}")
    finally:
        os.close(own)


def _attr(kind: int, payload: bytes) -> bytes:
    return struct.pack("=HH", 4 + len(payload), kind) + payload + b"\0" * (-len(payload) % 4)


def mac_bytes(mac: str) -> bytes:
    return bytes(int(b, 16) for b in mac.split(":"))


class Rtnl:
    """A NETLINK_ROUTE socket in namespace `ns` (None: this thread's), bound to `groups`."""

    def __init__(self, ns: Optional[str] = None, groups: int = 0, rcvbuf: int = 1 << 20):
        with in_netns(ns):
            self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
        try:
            try:
                self.sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, rcvbuf)
            except PermissionError:
                self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
            with contextlib.suppress(OSError):
                self.sock.setsockopt(SOL_NETLINK, NETLINK_EXT_ACK, 1)
            self.sock.bind((0, groups))
        except BaseException:
            self.sock.close()
            raise
        self.ns = ns
        self._seq = 0
        from pyroute2.netlink.rtnl.marshal import MarshalRtnl
        self._marshal = MarshalRtnl()

    def parse(self, data: bytes) -> list:
        """The messages in one datagram: neighbours and routes parsed here, the rest by pyroute2."""
        out, off = [], 0
        while off + 16 <= len(data):
            length, kind, flags, seq, _ = struct.unpack_from("=IHHII", data, off)
            if length < 16 or off + length > len(data):
                break
            if kind in _FAST:
                out.append(_FAST[kind](kind, flags, seq, data[off + 16:off + length]))
            elif kind in (NLMSG_DONE, NLMSG_ERROR):
                code = struct.unpack_from("=i", data, off + 16)[0] if kind == NLMSG_ERROR and length >= 20 else 0
                out.append(_Msg(kind, flags, seq, {}, {}, error=code))
            else:
                out.extend(self._marshal.parse(data[off:off + length]))
            off += (length + 3) & ~3
        return out

    def fileno(self) -> int:
        return self.sock.fileno()

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> "Rtnl":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _send(self, kind: int, flags: int, body: bytes) -> int:
        self._seq += 1
        self.sock.send(struct.pack("=IHHII", 16 + len(body), kind, flags, self._seq, 0) + body)
        return self._seq

    def dump(self, what: str) -> list:
        """Every message of one dump ("links", "addresses", "fdb", "neighbours", "routes"), parsed by
        pyroute2; done again (up to 10 times) when the kernel says a change interrupted it."""
        kind, header = _DUMPS[what]
        for _ in range(10):
            seq = self._send(kind, NLM_F_REQUEST | NLM_F_DUMP, header)
            out, interrupted = [], False
            while True:
                data = self.sock.recv(1 << 20)
                done = False
                for m in self.parse(data):
                    h = m["header"]
                    if h.get("sequence_number") != seq:
                        continue
                    interrupted |= bool(h["flags"] & NLM_F_DUMP_INTR)
                    if h["type"] == NLMSG_DONE:
                        done = True
                    elif h["type"] == NLMSG_ERROR:
                        code = h.get("error")
                        raise OSError(errno.EIO, f"netlink dump of {what} in {self.ns or 'this namespace'} "
                                                 f"failed: {code}")
                    else:
                        out.append(m)
                if done:
                    break
            if not interrupted:
                return out
        raise OSError(errno.EAGAIN, f"netlink dump of {what} in {self.ns or 'this namespace'} kept being "
                                    "interrupted by changes")

    def neigh(self, kind: int, flags: int, family: int, ifindex: int, state: int = 0, ntf: int = 0,
              dst: Optional[str] = None, lladdr: Optional[str] = None) -> None:
        """One RTM_NEWNEIGH / RTM_DELNEIGH (kind) for an FDB entry (family AF_BRIDGE) or a
        neighbour (AF_INET), waiting for the kernel's answer; OSError(errno, text) if refused."""
        body = struct.pack("=BxxxiHBB", family, ifindex, state, ntf, 0)
        if dst is not None:
            body += _attr(NDA_DST, ipaddress.ip_address(dst).packed)
        if lladdr is not None:
            body += _attr(NDA_LLADDR, mac_bytes(lladdr))
        seq = self._send(kind, NLM_F_REQUEST | NLM_F_ACK | flags, body)
        self._ack(seq)

    def _ack(self, seq: int) -> None:
        while True:
            data = self.sock.recv(1 << 16)
            off = 0
            while off + 16 <= len(data):
                length, kind, flags, mseq, _ = struct.unpack_from("=IHHII", data, off)
                if kind == NLMSG_ERROR and mseq == seq:
                    (code,) = struct.unpack_from("=i", data, off + 16)
                    if code == 0:
                        return
                    raise OSError(-code, _ext_ack(data[off:off + length], flags) or os.strerror(-code))
                off += (length + 3) & ~3 if length else len(data)

    def events(self) -> List:
        """The messages waiting on a socket bound to groups, parsed; [] when none. Raises
        OSError(ENOBUFS) when the kernel dropped some (the socket's buffer overran)."""
        out = []
        while True:
            try:
                data = self.sock.recv(1 << 20, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return out
            out.extend(self.parse(data))

    def drain(self) -> int:
        """Discards every message waiting on the socket; how many datagrams. After an overrun
        (ENOBUFS) the kernel reports the next one only once the socket's queue has been empty:
        until then it drops events without a word."""
        n = 0
        while True:
            try:
                self.sock.recv(1 << 20, socket.MSG_DONTWAIT)
                n += 1
            except BlockingIOError:
                return n
            except OSError as e:
                if e.errno != errno.ENOBUFS:
                    raise


class _Msg:
    """A parsed message: m["field"], m.get_attr("NAME"), m.get("event"), m["header"], as
    pyroute2's messages answer them."""
    __slots__ = ("fields", "attrs", "header")
    EVENTS = {RTM_NEWNEIGH: "RTM_NEWNEIGH", RTM_DELNEIGH: "RTM_DELNEIGH", RTM_NEWROUTE: "RTM_NEWROUTE",
              RTM_DELROUTE: "RTM_DELROUTE"}

    def __init__(self, kind: int, flags: int, seq: int, fields: dict, attrs: dict, error=None):
        self.fields, self.attrs = fields, attrs
        self.header = {"type": kind, "flags": flags, "sequence_number": seq, "error": error}
        fields["event"] = self.EVENTS.get(kind)

    def __getitem__(self, key):
        return self.header if key == "header" else self.fields[key]

    def get(self, key, default=None):
        return self.header if key == "header" else self.fields.get(key, default)

    def get_attr(self, name: str, default=None):
        return self.attrs.get(name, default)

    def __repr__(self) -> str:
        return f"<{self.fields.get('event') or self.header['type']} {self.fields} {self.attrs}>"


def _attrs(body: bytes, off: int):
    """(type, payload) of each rtattr from off on."""
    while off + 4 <= len(body):
        length, kind = struct.unpack_from("=HH", body, off)
        if length < 4:
            return
        yield kind & 0x3FFF, body[off + 4:off + length]
        off += (length + 3) & ~3


def _addr(payload: bytes) -> str:
    return socket.inet_ntop(socket.AF_INET if len(payload) == 4 else socket.AF_INET6, payload)


_NDMSG, _RTATTR, _U32 = struct.Struct("=BxxxiHBB"), struct.Struct("=HH"), struct.Struct("=I")


def _neigh(kind: int, flags: int, seq: int, body: bytes) -> _Msg:
    """An ndmsg (neighbour or FDB entry): the hot one, a fabric has tens of thousands."""
    family, ifindex, state, ntf, typ = _NDMSG.unpack_from(body, 0)
    attrs = {}
    off, end = 12, len(body)
    while off + 4 <= end:
        length, a = _RTATTR.unpack_from(body, off)
        if length < 4:
            break
        if a == NDA_DST:
            attrs["NDA_DST"] = socket.inet_ntop(socket.AF_INET if length == 8 else socket.AF_INET6,
                                                body[off + 4:off + length])
        elif a == NDA_LLADDR:
            attrs["NDA_LLADDR"] = body[off + 4:off + length].hex(":")
        elif a == NDA_MASTER:
            attrs["NDA_MASTER"] = _U32.unpack_from(body, off + 4)[0]
        off += (length + 3) & ~3
    return _Msg(kind, flags, seq, {"family": family, "ifindex": ifindex, "state": state, "flags": ntf,
                                   "ndm_type": typ}, attrs)


def _route(kind: int, flags: int, seq: int, body: bytes) -> _Msg:
    family, dst_len, src_len, tos, table, proto, scope, typ, rflags = struct.unpack_from("=BBBBBBBBI", body, 0)
    attrs: dict = {}
    for a, payload in _attrs(body, 12):
        if a in (RTA_DST, RTA_GATEWAY):
            attrs["RTA_DST" if a == RTA_DST else "RTA_GATEWAY"] = _addr(payload)
        elif a in _ROUTE_U32:
            attrs[_ROUTE_U32[a]] = struct.unpack_from("=I", payload)[0]
        elif a == RTA_MULTIPATH:
            hops, off = [], 0
            while off + 8 <= len(payload):             # struct rtnexthop, then its attributes
                length, hflags, _, oif = struct.unpack_from("=HBBi", payload, off)
                if length < 8:
                    break
                hop = {k: _addr(v) for k, v in _attrs(payload[off:off + length], 8) if k == RTA_GATEWAY}
                hops.append(_Msg(0, 0, 0, {"oif": oif, "flags": hflags},
                                 {"RTA_GATEWAY": hop[RTA_GATEWAY]} if hop else {}))
                off += (length + 3) & ~3
            attrs["RTA_MULTIPATH"] = hops
    return _Msg(kind, flags, seq, {"family": family, "dst_len": dst_len, "src_len": src_len, "tos": tos,
                                   "table": table, "proto": proto, "scope": scope, "type": typ, "flags": rflags},
                attrs)


_FAST = {RTM_NEWNEIGH: _neigh, RTM_DELNEIGH: _neigh, RTM_NEWROUTE: _route, RTM_DELROUTE: _route}


def _ext_ack(msg: bytes, flags: int) -> str:
    """The extended-ack text (NLMSGERR_ATTR_MSG) of an NLMSG_ERROR message, if any."""
    if not flags & NLM_F_ACK_TLVS:
        return ""
    off = 16 + 4 + (16 if flags & NLM_F_CAPPED else struct.unpack_from("=I", msg, 20)[0])
    while off + 4 <= len(msg):
        length, kind = struct.unpack_from("=HH", msg, off)
        if length < 4:
            break
        if kind == NLMSGERR_ATTR_MSG:
            return msg[off + 4:off + length].rstrip(b"\0").decode(errors="replace")
        off += (length + 3) & ~3
    return ""


def link_kind(link) -> Optional[str]:
    """The IFLA_INFO_KIND of a parsed link message ("bridge", "vxlan", "tun", "vrf"...)."""
    info = link.get_attr("IFLA_LINKINFO")
    return info.get_attr("IFLA_INFO_KIND") if info else None


def vxlan_id(link) -> Optional[int]:
    info = link.get_attr("IFLA_LINKINFO")
    data = info.get_attr("IFLA_INFO_DATA") if info else None
    return data.get_attr("IFLA_VXLAN_ID") if data else None
