"""The kernel shadow of dpu's tenants: what FRR sees of them, and what FRR installs for them.

The fabric mirror (docs/fabric.md; /work/shared/DESIGN.md, "The fabric mirror") lets FRR speak
BGP EVPN unmodified, as on a Cumulus switch or a BlueField running HBN: for every tenant the
kernel holds the objects zebra knows how to read, none of which ever forwards a packet:

    tenant "red" (a VRF: a namespace <tag>-red, or a kernel VRF device "red")
      br<l3vni>  bridge, MAC = the tenant's router MAC  ─ vx<l3vni>   (L3 VNI)
      br<vni>    bridge = SVI, MAC = anycast gateway MAC, the gateway addresses
                 ─ vx<vni> (L2 VNI: nolearning, neigh_suppress on, learning off)
                 ─ <port>  a representor: a TAP nobody opens (no carrier)
      per port:  `<mac> dev <port> master static` and `<ip> lladdr <mac> dev br<vni> permanent`

- `Shadow.apply(tenants)` reconciles: it reads the kernel, computes the difference with what
  is wanted and changes only that (an apply with nothing new writes nothing, so a new Shadow
  over the kernel state of a previous dpu adopts it and nothing is withdrawn). Removals come
  first (neighbour before MAC: FRR withdraws MAC+IP, then MAC), then devices, then the new
  entries (MAC before neighbour: zebra advertises MAC+IP only for a MAC it knows). Every
  argument is checked before anything is touched; a kernel refusal midway raises
  FabricError naming the step, and the next apply() completes the reconcile.
- The VXLAN devices are created where the underlay address lives (`underlay_netns`) and, in
  netns mode, moved into the tenant's namespace: their UDP socket stays in the underlay
  namespace (which is why `dpu.fabric.underlay.guard_vxlan` must keep the kernel from
  answering VXLAN there).
- zebra reads static MACs when it starts, but not permanent neighbours, and after a VXLAN
  device goes down and up it re-reads MACs only; a `replace` with unchanged content is
  silent. So `resignal()` deletes and re-adds every local neighbour: call it once zebra runs
  (after `ManagedFrr.start()`), and the watch (`watch()`) does it by itself for the VNIs of
  a VXLAN device it sees come back up.
- `read()` dumps each tenant's namespace over netlink and returns what FRR installed
  (`Learned`; tests/EVPN_LAB.md, "What FRR installs"); `watch()` calls back when that may
  have changed (dpu.fabric.watch).
- Every object carries an alias `dpu-shadow:<tag>[:role]`, so that the kernel says what is
  dpu's: a new Shadow finds its tenants, and destroy() removes exactly them.

Two VRF modes: "netns" (one namespace per tenant, zebra -n; the only mode this machine's
kernel allows, as it has no VRF device) and "kernel" (a VRF device per tenant in the underlay
namespace, table KERNEL_VRF_TABLE_BASE + L3 VNI; zebra without -n). `kernel_vrfs_available()`
says whether the kernel has VRF devices.

Threads: apply, resignal, read and destroy may be called from any thread; writes hold the
Shadow's lock, read() uses sockets of its own. `keep=False` (default) registers destroy() with
dpu.cleanup, so the shadow goes when the process ends; `keep=True` leaves it for the next
dpu to adopt (with an FRR that outlives dpu: `frr: external`).
"""
from __future__ import annotations

import contextlib
import errno
import ipaddress
import logging
import os
import re
import shutil
import socket
import subprocess
import threading
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Set, Tuple

from .. import cleanup
from ..errors import FabricError, InvalidArgumentError
from . import netlink as nl
from .fold import ALIAS, Learned, Place, Scan, dump_ns, learned_of, members
from .watch import READ_DUMPS, Watcher, settled_dump

log = logging.getLogger("dpu.fabric")

KERNEL_VRF_TABLE_BASE = 1 << 24       # kernel mode: tenant table = base + L3 VNI (never 253..255)
MODES = ("netns", "kernel", "auto")
_MAC = re.compile(r"[0-9a-f]{2}(:[0-9a-f]{2}){5}")
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,14}")
_IFNAME = re.compile(r"[A-Za-z0-9_.-]{1,15}")
_TAG = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,39}")
_RESERVED_IFNAME = re.compile(r"(br|vx)\d+|lo|dpufx\d+")


# ---- what is wanted ---------------------------------------------------------------------------

@dataclass(frozen=True)
class ShadowPort:
    """A local endpoint of a tenant: a representor `name` on VNI `vni`'s bridge, its MAC as a
    static FDB entry there and, with `ip`, a permanent neighbour on the VNI's SVI."""
    name: str
    vni: int
    mac: str
    ip: Optional[str] = None


@dataclass(frozen=True)
class ShadowSubnet:
    """One L2 VNI of a tenant: bridge + VXLAN device + SVI carrying the anycast gateway(s)
    ("10.0.0.1/24", ...) with MAC `gateway_mac`. No gateways: an L2-only VNI."""
    vni: int
    gateway_mac: str
    gateways: Tuple[str, ...] = ()


@dataclass(frozen=True)
class ShadowTenant:
    """One tenant: a VRF (FRR's name for it is `name`) with L3 VNI `l3vni`, whose bridge carries
    the router MAC, its subnets and its local ports."""
    name: str
    l3vni: int
    router_mac: str
    subnets: Tuple[ShadowSubnet, ...] = ()
    ports: Tuple[ShadowPort, ...] = ()


def _mac(value, where: str, problems: List[str]) -> str:
    mac = str(value).strip().lower().replace("-", ":")
    if not _MAC.fullmatch(mac):
        problems.append(f"{where}: {value!r} is not a MAC address (six hex bytes, e.g. 02:00:00:00:00:01)")
    elif int(mac[:2], 16) & 1:
        problems.append(f"{where}: {value!r} is a multicast MAC address; it must be unicast")
    elif mac == nl.ZERO_MAC:
        problems.append(f"{where}: the all-zero MAC address is not an endpoint's")
    return mac


def _vni(value, where: str, problems: List[str]) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 0xFFFFFF:
        problems.append(f"{where}: {value!r} is not a VNI (a whole number from 1 to 16777215)")
        return -1
    return value


def validate(tenants: Sequence[ShadowTenant], mode: str = "netns") -> Tuple[ShadowTenant, ...]:
    """The tenants with MACs, addresses and gateways written one way (lower case, as
    ipaddress prints them), or InvalidArgumentError with one line per mistake."""
    problems: List[str] = []
    out: List[ShadowTenant] = []
    vni_owner: Dict[int, str] = {}
    port_owner: Dict[str, str] = {}
    if isinstance(tenants, (str, bytes)) or not isinstance(tenants, Iterable):
        raise InvalidArgumentError(f"tenants: expected a sequence of ShadowTenant, got {type(tenants).__name__}")
    for t in tenants:
        if not isinstance(t, ShadowTenant):
            problems.append(f"tenants: {t!r} is not a ShadowTenant")
            continue
        where = f"tenant {t.name!r}"
        if not isinstance(t.name, str) or not _NAME.fullmatch(t.name) or t.name == "default":
            problems.append(f"{where}: the name must be 1 to 15 letters, digits, '_', '.' or '-', begin with a "
                            "letter and not be 'default' (it names the VRF in FRR and the kernel)")
        if t.name in (o.name for o in out):
            problems.append(f"{where}: named twice")
        l3vni = _vni(t.l3vni, f"{where}: l3vni", problems)
        rmac = _mac(t.router_mac, f"{where}: router_mac", problems)

        def own_vni(vni: int, what: str) -> None:
            if vni in vni_owner:
                problems.append(f"{where}: {what} {vni} is already {vni_owner[vni]}")
            else:
                vni_owner[vni] = f"{what} of tenant {t.name!r}"
        if l3vni > 0:
            own_vni(l3vni, "l3vni")
        subnets: Dict[int, ShadowSubnet] = {}
        networks: List[Tuple[ipaddress.IPv4Network, int]] = []
        for s in t.subnets:
            if not isinstance(s, ShadowSubnet):
                problems.append(f"{where}: subnets: {s!r} is not a ShadowSubnet")
                continue
            vni = _vni(s.vni, f"{where}: subnet vni", problems)
            swhere = f"{where}: subnet {s.vni}"
            if vni > 0:
                own_vni(vni, "vni")
            gws = []
            for g in (s.gateways,) if isinstance(s.gateways, str) else s.gateways:
                try:
                    iface = ipaddress.ip_interface(g)
                except ValueError:
                    problems.append(f"{swhere}: gateway {g!r} is not an address with its prefix length "
                                    "(e.g. 10.0.0.1/24)")
                    continue
                if iface.version != 4:
                    problems.append(f"{swhere}: gateway {g!r}: only IPv4 tenant subnets are supported")
                    continue
                if "/" not in str(g):
                    problems.append(f"{swhere}: gateway {g!r} needs its prefix length (e.g. 10.0.0.1/24)")
                    continue
                for net, other in networks:
                    if net.overlaps(iface.network):
                        problems.append(f"{swhere}: gateway {g} overlaps subnet {other}'s {net}")
                networks.append((iface.network, s.vni))
                gws.append(str(iface))
            subnets[vni] = ShadowSubnet(vni, _mac(s.gateway_mac, f"{swhere}: gateway_mac", problems), tuple(gws))
        ports: List[ShadowPort] = []
        seen_mac: Dict[Tuple[int, str], str] = {}
        seen_ip: Dict[Tuple[int, str], str] = {}
        for p in t.ports:
            if not isinstance(p, ShadowPort):
                problems.append(f"{where}: ports: {p!r} is not a ShadowPort")
                continue
            pwhere = f"{where}: port {p.name!r}"
            if not isinstance(p.name, str) or not _IFNAME.fullmatch(p.name) or p.name in (".", "..") \
                    or _RESERVED_IFNAME.fullmatch(p.name):
                problems.append(f"{pwhere}: a port name is an interface name: 1 to 15 letters, digits, '_', '.' "
                                "or '-', and not lo, br<N>, vx<N> (the shadow's own devices)")
            owner = port_owner.get(p.name)
            if owner == t.name or (owner is not None and mode == "kernel"):
                problems.append(f"{pwhere}: named twice" + (f" (also in tenant {owner!r}; kernel VRFs share one "
                                                           "namespace)" if owner != t.name else ""))
            port_owner.setdefault(p.name, t.name)
            if mode == "kernel" and p.name == t.name:
                problems.append(f"{pwhere}: the tenant's VRF device has that name")
            mac = _mac(p.mac, f"{pwhere}: mac", problems)
            subnet = subnets.get(p.vni)
            if subnet is None:
                problems.append(f"{pwhere}: vni {p.vni!r} is not one of the tenant's subnets "
                                f"({', '.join(str(v) for v in subnets) or 'none'})")
            elif mac in (subnet.gateway_mac, rmac):
                problems.append(f"{pwhere}: mac {mac} is the tenant's gateway or router MAC")
            if (p.vni, mac) in seen_mac:
                problems.append(f"{pwhere}: mac {mac} is already port {seen_mac[(p.vni, mac)]!r}'s on vni {p.vni}")
            seen_mac[(p.vni, mac)] = p.name
            addr = None
            if p.ip is not None:
                try:
                    a = ipaddress.ip_address(p.ip)
                except ValueError:
                    problems.append(f"{pwhere}: ip {p.ip!r} is not an IP address (e.g. 10.0.0.11, no prefix "
                                    "length)")
                else:
                    addr = str(a)
                    if a.version != 4:
                        problems.append(f"{pwhere}: ip {p.ip}: only IPv4 endpoints are supported")
                    elif subnet is not None and subnet.gateways and not any(
                            a in ipaddress.ip_interface(g).network for g in subnet.gateways):
                        problems.append(f"{pwhere}: ip {p.ip} is outside subnet {p.vni} "
                                        f"({', '.join(subnet.gateways)})")
                    elif subnet is not None and any(a == ipaddress.ip_interface(g).ip for g in subnet.gateways):
                        problems.append(f"{pwhere}: ip {p.ip} is the subnet's gateway address")
                    if (p.vni, addr) in seen_ip:
                        problems.append(f"{pwhere}: ip {addr} is already port {seen_ip[(p.vni, addr)]!r}'s on "
                                        f"vni {p.vni}")
                    seen_ip[(p.vni, addr)] = p.name
            ports.append(ShadowPort(p.name, p.vni, mac, addr))
        out.append(ShadowTenant(t.name, l3vni, rmac, tuple(subnets.values()), tuple(ports)))
    if problems:
        raise InvalidArgumentError("\n".join(problems))
    return tuple(out)


# ---- running ip ------------------------------------------------------------------------------

def _ip_batch(ns: Optional[str], lines: List[str], what: str) -> None:
    """`ip [-n ns] -batch -` over lines; FabricError naming the line the kernel refused."""
    if not lines:
        return
    ip = shutil.which("ip") or next((p for p in ("/usr/sbin/ip", "/sbin/ip") if os.access(p, os.X_OK)), None)
    if ip is None:
        raise FabricError(f"{what}: the ip command (iproute2) is not installed")
    cmd = [ip] + (["-n", ns] if ns else []) + ["-batch", "-"]
    r = subprocess.run(cmd, input="\n".join(lines) + "\n", capture_output=True, text=True)
    if r.returncode == 0:
        return
    err = r.stderr.strip()
    m = re.search(r"Command failed -:(\d+)", err)
    line = lines[int(m.group(1)) - 1] if m and 0 < int(m.group(1)) <= len(lines) else "; ".join(lines)
    reason = next((ln for ln in err.splitlines() if not ln.startswith("Command failed")), err) or \
        f"exit status {r.returncode}"
    raise FabricError(f"{what}: `ip {'-n ' + ns + ' ' if ns else ''}{line}` failed: {reason}")


def _sysctl(ns: Optional[str], key: str, value: int) -> None:
    with nl.in_netns(ns), open(f"/proc/sys/{key.replace('.', '/')}", "w") as f:
        f.write(f"{value}\n")


def _netns_names() -> List[str]:
    try:
        return sorted(os.listdir("/run/netns"))
    except FileNotFoundError:
        return []


def kernel_vrfs_available() -> bool:
    """Whether this kernel makes VRF devices (`ip link add type vrf`): tried in a scratch
    network namespace that is removed again."""
    name = f"dpu-vrfprobe-{os.getpid()}-{threading.get_ident() % 10000}"
    with cleanup.deferred():
        r = subprocess.run(["ip", "netns", "add", name], capture_output=True)
        if r.returncode != 0:
            return False
        handle = cleanup.register(cleanup.netns_remove, name)
    try:
        return subprocess.run(["ip", "-n", name, "link", "add", "probe", "type", "vrf", "table", "10"],
                              capture_output=True).returncode == 0
    finally:
        handle.run()


# ---- the shadow ------------------------------------------------------------------------------

@dataclass
class _Entries:
    """Entry changes of one apply, by namespace: (ifname, mac) FDB entries on ports, and
    (svi, ip, mac) neighbours."""
    fdb_del: List[Tuple[Optional[str], str, str]] = field(default_factory=list)
    neigh_del: List[Tuple[Optional[str], str, str, str]] = field(default_factory=list)
    fdb_add: List[Tuple[Optional[str], str, str]] = field(default_factory=list)
    neigh_add: List[Tuple[Optional[str], str, str, str]] = field(default_factory=list)


class Shadow:
    """The kernel shadow of one dpu host's tenants (module docstring).

    tag: names what is this Shadow's (namespaces `<tag>-<tenant>`, aliases `dpu-shadow:<tag>`);
    vtep_ip: the host's underlay address, the VXLAN devices' `local`; vxlan_port: their UDP
    port; underlay_netns: the namespace holding the underlay address and the VXLAN sockets
    (None: this process's); mode: "netns", "kernel" or "auto" (kernel VRFs where the kernel has
    them); keep: leave the kernel state when the process ends (else dpu.cleanup destroys it).
    """

    def __init__(self, tag: str, vtep_ip: str, vxlan_port: int = 4789, underlay_netns: Optional[str] = None,
                 *, mode: str = "netns", keep: bool = False):
        problems = []
        if not isinstance(tag, str) or not _TAG.fullmatch(tag):
            problems.append(f"tag {tag!r}: 1 to 40 letters, digits, '_', '.' or '-', beginning with a letter or digit")
        try:
            ipaddress.ip_address(vtep_ip)
        except ValueError:
            problems.append(f"vtep_ip {vtep_ip!r} is not an IP address")
        if isinstance(vxlan_port, bool) or not isinstance(vxlan_port, int) or not 1 <= vxlan_port <= 65535:
            problems.append(f"vxlan_port {vxlan_port!r} is not a UDP port (1 to 65535)")
        if mode not in MODES:
            problems.append(f"mode {mode!r}: expected one of {', '.join(MODES)}")
        if underlay_netns is not None and not os.path.exists(f"/run/netns/{underlay_netns}"):
            problems.append(f"underlay_netns {underlay_netns!r}: no such network namespace (/run/netns)")
        if problems:
            raise InvalidArgumentError("\n".join(problems))
        if mode == "auto":
            mode = "kernel" if kernel_vrfs_available() else "netns"
        self.tag, self.vtep_ip, self.vxlan_port = tag, str(ipaddress.ip_address(vtep_ip)), vxlan_port
        self.underlay_netns, self.mode, self.keep = underlay_netns, mode, keep
        self._wanted: Optional[Dict[str, ShadowTenant]] = None      # None until the first apply()
        self._lock = threading.RLock()
        self._watcher = None
        self._cleanup = None if keep else cleanup.register(self._remove)

    # -- where things are

    def _place(self, tenant: ShadowTenant) -> Place:
        if self.mode == "kernel":
            return Place(self.underlay_netns, tenant.name, KERNEL_VRF_TABLE_BASE + tenant.l3vni)
        return Place(f"{self.tag}-{tenant.name}", None, nl.RT_TABLE_MAIN)

    def _alias(self, role: str = "") -> str:
        return f"{ALIAS}:{self.tag}" + (f":{role}" if role else "")

    def _found(self) -> Dict[str, Place]:
        """Tenants this tag has in the kernel now (by their marks), with their places."""
        out: Dict[str, Place] = {}
        if self.mode == "kernel":
            with contextlib.suppress(OSError):
                scan = dump_ns(self.underlay_netns, entries=False)
                for link in scan.links.values():
                    if link.kind == "vrf" and link.alias == self._alias():
                        out[link.name] = Place(self.underlay_netns, link.name, link.table or 0)
            return out
        prefix = f"{self.tag}-"
        for ns in _netns_names():
            if not ns.startswith(prefix):
                continue
            with contextlib.suppress(OSError):
                lo = dump_ns(ns, entries=False).by_name("lo")
                if lo is not None and lo.alias == self._alias():
                    out[ns[len(prefix):]] = Place(ns, None, nl.RT_TABLE_MAIN)
        return out

    def _tenant_places(self, names: Optional[Iterable[str]] = None) -> Dict[str, Tuple[Place, Optional[int]]]:
        """tenant -> (place, L3 VNI if known) for the wanted tenants (or, before any apply(),
        those found in the kernel); `names` selects some."""
        if self._wanted is not None:
            places = {n: (self._place(t), t.l3vni) for n, t in self._wanted.items()}
        else:
            places = {n: (p, None) for n, p in self._found().items()}
        if names is not None:
            names = set(names)
            unknown = names - set(places)
            if unknown:
                raise InvalidArgumentError(f"no tenant {', '.join(sorted(map(repr, unknown)))} in shadow {self.tag!r}")
            places = {n: v for n, v in places.items() if n in names}
        return places

    def namespaces(self) -> Dict[str, str]:
        """tenant -> network namespace, zebra's VRFs for its netns backend (ManagedFrr's
        `vrfs`); {} in kernel mode, where the VRFs are devices zebra finds itself."""
        if self.mode == "kernel":
            return {}
        return {n: p.ns for n, (p, _) in self._tenant_places().items()}

    def tenants(self) -> Tuple[ShadowTenant, ...]:
        """What the last apply() asked for (normalised), in its order."""
        return tuple((self._wanted or {}).values())

    # -- writing

    def apply(self, tenants: Sequence[ShadowTenant]) -> None:
        """Makes the kernel shadow exactly `tenants` (see the module docstring). Idempotent."""
        wanted = validate(tenants, self.mode)
        with self._lock:
            found = self._found()
            scans: Dict[Optional[str], Scan] = {}
            for place in list(found.values()) + [self._place(t) for t in wanted]:
                # a tenant namespace without the mark is one a process died making: adopted
                if place.ns not in scans and (place.vrf is not None or os.path.exists(f"/run/netns/{place.ns}")):
                    scans[place.ns] = dump_ns(place.ns)
            self._check_conflicts(wanted, found, scans)
            steps: List[Tuple[Optional[str], str]] = []
            entries = _Entries()
            flapped: Dict[str, Set[int]] = {}
            keep = {t.name for t in wanted}
            for name, place in found.items():
                if name not in keep:
                    self._plan_removal(place, scans[place.ns], steps)
            for t in wanted:
                place = self._place(t)
                self._plan_tenant(t, place, scans.get(place.ns), steps, entries, flapped.setdefault(t.name, set()))
            self._write_entries(neigh_del=entries.neigh_del, fdb_del=entries.fdb_del)
            self._run_steps(steps)
            self._write_entries(fdb_add=entries.fdb_add, neigh_add=entries.neigh_add)
            for name, place in found.items():
                if name not in keep and place.vrf is None:
                    cleanup.netns_remove(place.ns)
            self._wanted = {t.name: t for t in wanted}
            if self._watcher is not None:
                self._watcher.refresh()
            else:
                for t in wanted:
                    if flapped[t.name]:
                        self._resignal(t, flapped[t.name])

    def _check_conflicts(self, wanted, found, scans) -> None:
        """Kernel mode: a device of the shared namespace bearing a name the shadow needs but not
        its alias is someone else's: refused before anything changes."""
        if self.mode != "kernel":
            return
        scan = scans[self.underlay_netns]
        problems = []
        for t in wanted:
            names = [t.name] + [f"{d}{v}" for v in [t.l3vni] + [s.vni for s in t.subnets] for d in ("br", "vx")]
            for n in names + [p.name for p in t.ports]:
                link = scan.by_name(n)
                if link is not None and not link.alias.startswith(self._alias()):
                    problems.append(f"tenant {t.name!r}: device {n!r} exists in "
                                    f"{self.underlay_netns or 'this namespace'} and is not the shadow's")
        if problems:
            raise FabricError("\n".join(problems))

    def _plan_removal(self, place: Place, scan: Scan, steps) -> None:
        """A tenant no longer wanted: its ports, VXLAN devices (zebra withdraws the VNI's
        routes), bridges, then (kernel mode) its VRF; in netns mode the namespace goes after."""
        mine = members(scan, place)
        links = [scan.links[i] for i in mine]
        for kind in ("tun", "vxlan", "bridge", "vrf"):
            for link in links:
                if link.kind == kind and (place.vrf is None or link.alias.startswith(self._alias())):
                    steps.append((place.ns, f"link del {link.name}"))

    def _plan_tenant(self, t: ShadowTenant, place: Place, scan: Optional[Scan], steps,
                     entries: _Entries, flapped: Set[int]) -> None:
        ns = place.ns
        new_ns = scan is None
        if new_ns:
            steps.append((None, f"netns add {ns}"))
            scan = Scan({}, {}, [], [], [])
        if place.vrf is None and getattr(scan.by_name("lo"), "alias", None) != self._alias():
            steps.append((ns, f"link set lo up alias {self._alias()}"))
        mine = members(scan, place)
        links = {scan.links[i].name: scan.links[i] for i in mine}
        if place.vrf is not None and place.vrf not in links:
            steps.append((ns, f"link add {place.vrf} type vrf table {place.table}"))
            steps.append((ns, f"link set {place.vrf} alias {self._alias()} up"))
        vnis = [(t.l3vni, t.router_mac, (), "l3vni")] + [(s.vni, s.gateway_mac, s.gateways, "l2vni")
                                                          for s in t.subnets]
        wanted_devs = {place.vrf} if place.vrf else set()
        for vni, mac, gateways, role in vnis:
            br, vx = f"br{vni}", f"vx{vni}"
            wanted_devs |= {br, vx}
            b = links.get(br)
            master = f" master {place.vrf}" if place.vrf else ""
            if b is None:
                steps.append((ns, f"link add {br} address {mac} type bridge"))
                steps.append((ns, f"link set {br}{master} addrgenmode none alias {self._alias(role)} up"))
                have_addrs: Set[str] = set()
            else:
                if b.mac != mac:
                    steps.append((ns, f"link set {br} address {mac}"))
                if b.alias != self._alias(role):
                    steps.append((ns, f"link set {br} alias {self._alias(role)}"))
                if place.vrf and links.get(place.vrf) and b.master != links[place.vrf].index:
                    steps.append((ns, f"link set {br}{master}"))
                if not b.flags & nl.IFF_UP:
                    steps.append((ns, f"link set {br} up"))
                have_addrs = {a for a in scan.addrs.get(b.index, set())}
            for g in sorted(set(gateways) - have_addrs):
                steps.append((ns, f"addr add {g} dev {br}"))
            for g in sorted(have_addrs - set(gateways)):
                steps.append((ns, f"addr del {g} dev {br}"))
            v = links.get(vx)
            if v is not None and (v.vni, v.local, v.port) != (vni, self.vtep_ip, self.vxlan_port):
                steps.append((ns, f"link del {vx}"))        # another VTEP address or port: made again
                v = None
            if v is None:
                self._plan_vxlan(ns, vx, vni, br, steps)
            else:
                if b is None or v.master != b.index:
                    steps.append((ns, f"link set {vx} master {br}"))
                    steps.append((ns, f"link set dev {vx} type bridge_slave neigh_suppress on learning off"))
                if not v.flags & nl.IFF_UP:
                    steps.append((ns, f"link set {vx} up"))
                    flapped.add(vni)
        # ports: representors (TAPs nobody opens) on their VNI's bridge
        wanted_ports = {p.name: p for p in t.ports}
        moved: Set[str] = set()
        for p in t.ports:
            link = links.get(p.name)
            br = links.get(f"br{p.vni}")
            if link is None:
                steps.append((ns, f"tuntap add dev {p.name} mode tap"))
                steps.append((ns, f"link set {p.name} master br{p.vni} addrgenmode none "
                                  f"alias {self._alias('port')} up"))
            elif br is None or link.master != br.index:
                steps.append((ns, f"link set {p.name} master br{p.vni}"))     # the kernel flushes its FDB
                moved.add(p.name)
            elif not link.flags & nl.IFF_UP:
                steps.append((ns, f"link set {p.name} up"))
        # devices no longer wanted (in a tenant namespace every one is the shadow's; in the
        # shared one of kernel VRFs those with its alias): ports, then VXLAN devices, then bridges
        order = {"tun": 0, "vxlan": 1, "bridge": 2}
        gone = sorted((name for name, link in links.items()
                       if link.kind in order and name not in wanted_devs and name not in wanted_ports
                       and (place.vrf is None or link.alias.startswith(self._alias()))),
                      key=lambda n: (order[links[n].kind], n))
        for name in gone:
            steps.append((ns, f"link del {name}"))
        # entries
        names = {i: link.name for i, link in scan.links.items() if i in mine}
        have_fdb = set()
        for e in scan.fdb:
            port = names.get(e["ifindex"])
            if port is None or links[port].alias != self._alias("port") or port in moved:
                continue
            if e["state"] == nl.NUD_NOARP and not e["flags"] & nl.NTF_EXT_LEARNED:
                have_fdb.add((port, e.get_attr("NDA_LLADDR")))
        have_neigh: Dict[Tuple[str, str], str] = {}
        for n in scan.neigh:
            svi = names.get(n["ifindex"])
            if svi is None or links[svi].alias != self._alias("l2vni"):
                continue
            if n["state"] & nl.NUD_PERMANENT and not n["flags"] & nl.NTF_EXT_LEARNED:
                have_neigh[(svi, n.get_attr("NDA_DST"))] = (n.get_attr("NDA_LLADDR") or "").lower()
        want_fdb = {(p.name, p.mac) for p in t.ports}
        want_neigh = {(f"br{p.vni}", p.ip): p.mac for p in t.ports if p.ip}
        for (svi, ip), mac in sorted(have_neigh.items()):
            if want_neigh.get((svi, ip)) != mac and svi not in gone:
                entries.neigh_del.append((ns, svi, ip, mac))
        for port, mac in sorted(have_fdb - want_fdb):
            if port not in gone:
                entries.fdb_del.append((ns, port, mac))
        for port, mac in sorted(want_fdb - have_fdb):
            entries.fdb_add.append((ns, port, mac))
        for (svi, ip), mac in sorted(want_neigh.items()):
            if have_neigh.get((svi, ip)) != mac:
                entries.neigh_add.append((ns, svi, ip, mac))

    def _plan_vxlan(self, ns: Optional[str], vx: str, vni: int, br: str, steps) -> None:
        """A VXLAN device born where the underlay address is (its socket stays there), moved
        into the tenant's namespace in netns mode."""
        args = f"type vxlan id {vni} local {self.vtep_ip} dstport {self.vxlan_port} nolearning"
        if self.mode == "kernel":
            steps.append((ns, f"link add {vx} {args}"))
        else:
            tmp = f"dpufx{vni}"
            steps.append((self.underlay_netns, f"link add {tmp} {args}"))
            steps.append((self.underlay_netns, f"link set {tmp} netns {ns} name {vx}"))
        steps.append((ns, f"link set {vx} master {br} addrgenmode none alias {self._alias('vxlan')}"))
        steps.append((ns, f"link set dev {vx} type bridge_slave neigh_suppress on learning off"))
        steps.append((ns, f"link set {vx} up"))

    def _run_steps(self, steps) -> None:
        """The ip commands, consecutive ones of a namespace in one `ip -batch`; a namespace made
        here is recorded with dpu.cleanup before anything else happens (signals wait)."""
        what = f"shadow {self.tag}"
        i = 0
        while i < len(steps):
            ns = steps[i][0]
            j = i
            while j < len(steps) and steps[j][0] == ns:
                j += 1
            lines = [line for _, line in steps[i:j]]
            with cleanup.deferred():
                _ip_batch(ns, lines, what)
            for line in lines:
                if line.startswith("netns add "):
                    new = line.split()[2]
                    _sysctl(new, "net.ipv6.conf.all.disable_ipv6", 1)      # no RS, MLD or IPv6 neighbours
                    _sysctl(new, "net.ipv6.conf.default.disable_ipv6", 1)
            i = j

    def _write_entries(self, neigh_del=(), fdb_del=(), fdb_add=(), neigh_add=()) -> None:
        """FDB entries and neighbours over netlink, in this order: neighbour deletions, FDB
        deletions, FDB additions, neighbour additions (ifindexes looked up by name now)."""
        socks: Dict[Optional[str], Tuple[nl.Rtnl, Dict[str, int]]] = {}

        def sock(ns):
            if ns not in socks:
                s = nl.Rtnl(ns)
                socks[ns] = (s, {link.name: i for i, link in dump_ns(ns, entries=False).links.items()})
            return socks[ns]

        def do(ns, what, fn):
            s, idx = sock(ns)
            try:
                fn(s, idx)
            except (OSError, KeyError) as e:
                reason = e.strerror if isinstance(e, OSError) else f"no device {e.args[0]}"
                raise FabricError(f"shadow {self.tag}: {what} in {ns or 'this namespace'} failed: {reason}") from None
        try:
            for ns, svi, ip, mac in neigh_del:
                do(ns, f"deleting neighbour {ip} dev {svi}", lambda s, idx: _del_neigh(s, idx[svi], ip))
            for ns, port, mac in fdb_del:
                do(ns, f"deleting {mac} dev {port} master static",
                   lambda s, idx: _ignore_missing(s.neigh, nl.RTM_DELNEIGH, 0, socket.AF_BRIDGE, idx[port],
                                                  ntf=nl.NTF_MASTER, lladdr=mac))
            for ns, port, mac in fdb_add:
                do(ns, f"adding {mac} dev {port} master static",
                   lambda s, idx: s.neigh(nl.RTM_NEWNEIGH, nl.NLM_F_CREATE | nl.NLM_F_REPLACE, socket.AF_BRIDGE,
                                          idx[port], state=nl.NUD_NOARP, ntf=nl.NTF_MASTER, lladdr=mac))
            for ns, svi, ip, mac in neigh_add:
                do(ns, f"adding neighbour {ip} lladdr {mac} dev {svi} permanent",
                   lambda s, idx: s.neigh(nl.RTM_NEWNEIGH, nl.NLM_F_CREATE | nl.NLM_F_REPLACE, socket.AF_INET,
                                          idx[svi], state=nl.NUD_PERMANENT, dst=ip, lladdr=mac))
        finally:
            for s, _ in socks.values():
                s.close()

    def resignal(self) -> None:
        """Deletes and adds again every local neighbour (the permanent ones on the SVIs), so that
        zebra advertises their MAC+IP routes: after zebra (re)starts, which reads static MACs but
        not neighbours that were already there."""
        with self._lock:
            for t in (self._wanted or {}).values():
                self._resignal(t, None)

    def _resignal(self, t: ShadowTenant, vnis: Optional[Set[int]]) -> None:
        ns = self._place(t).ns
        ports = [p for p in t.ports if p.ip and (vnis is None or p.vni in vnis)]
        rows = [(ns, f"br{p.vni}", p.ip, p.mac) for p in ports]
        self._write_entries(neigh_del=rows, neigh_add=rows)

    # -- reading

    def read(self, tenants: Optional[Iterable[str]] = None) -> Dict[str, Learned]:
        """What FRR installed, per tenant (all, or those named): a netlink dump of links, FDB,
        neighbours and routes per namespace, repeated until two agree (settled_dump: an FDB dump
        racing deletions skips entries that stay, which a caller would take for withdrawn). In a
        namespace that keeps changing through READ_DUMPS dumps, every entry one of them listed
        (the newest version of each): one withdrawn meanwhile may be kept until the next read or
        watch event, and one that stayed is missing only if every dump skipped it. Safe from any
        thread."""
        places = self._tenant_places(tenants)
        scans: Dict[Optional[str], Scan] = {}
        out = {}
        for name, (place, _) in places.items():
            if place.ns not in scans:
                try:
                    scans[place.ns], agreed = settled_dump(place.ns, READ_DUMPS, merge=True)
                except OSError as e:
                    raise FabricError(f"shadow {self.tag}: reading tenant {name!r} in {place.ns}: "
                                      f"{e.strerror or e}") from None
                if not agreed:
                    log.info("shadow %s: %s kept changing while it was read (%d dumps differed): "
                             "what any of them listed stands", self.tag, place.ns or "this namespace",
                             READ_DUMPS)
            out[name] = learned_of(scans[place.ns], place, self.tag)
        return out

    # -- watching

    def watch(self, on_change: Callable[[Set[str]], None], debounce_s: float = 0.02,
              max_delay_s: Optional[float] = None) -> None:
        """Starts a thread with a netlink socket per tenant namespace (link, neighbour and IPv4
        route groups) that calls on_change(tenant names) when what FRR installed may have
        changed: once `debounce_s` passed without another event, or `max_delay_s` (default 4 x
        debounce_s) after the first, never twice within debounce_s. It also re-signals the
        neighbours of a VNI whose VXLAN device comes back up. stop() ends it."""
        with self._lock:
            if self._watcher is not None:
                raise InvalidArgumentError(f"shadow {self.tag} is already being watched (stop() first)")
            w = self._watcher = Watcher(self, on_change, debounce_s, max_delay_s)
        try:
            w.start()   # it dumps every tenant's namespace: not under the lock apply() takes
        except BaseException:
            with self._lock:
                if self._watcher is w:
                    self._watcher = None
            raise

    def watched(self) -> Optional[Dict[str, Learned]]:
        """In a watch callback: what every tenant learned, as the watch's events built it (what
        read() would return, without a dump); None when some tenant is not watched."""
        w = self._watcher
        return w.learned() if w is not None else None

    def batch_since(self) -> Optional[float]:
        """In a watch callback: time.monotonic() when the first event it reports was read."""
        w = self._watcher
        return w.batch_since if w is not None else None

    def stop(self) -> None:
        """Ends the watch (if any); the kernel state stays."""
        w, self._watcher = self._watcher, None
        if w is not None:
            w.stop()

    def destroy(self) -> None:
        """Removes every namespace and device of this Shadow's tag (also ones a previous
        process left), and forgets the registered cleanup. Also safe while zebra runs: the
        devices are deleted before the namespaces, which zebra's mounts may keep alive."""
        if self._cleanup is not None:
            self._cleanup.cancel()
        self._remove()

    def _remove(self) -> None:
        self.stop()
        with self._lock:
            found = self._found()
            extra = {n: self._place(t) for n, t in (self._wanted or {}).items() if n not in found}
            for name, place in list(found.items()) + list(extra.items()):
                steps: List[Tuple[Optional[str], str]] = []
                if place.vrf is not None or os.path.exists(f"/run/netns/{place.ns}"):
                    with contextlib.suppress(OSError):
                        self._plan_removal(place, dump_ns(place.ns, entries=False), steps)
                with contextlib.suppress(FabricError):
                    self._run_steps(steps)
                if place.vrf is None:
                    cleanup.netns_remove(place.ns)
            self._wanted = None


def _ignore_missing(fn, *args, **kwargs) -> None:
    try:
        fn(*args, **kwargs)
    except OSError as e:
        if e.errno not in (errno.ENOENT, errno.ESRCH):
            raise


def _del_neigh(s: nl.Rtnl, ifindex: int, ip: str) -> None:
    _ignore_missing(s.neigh, nl.RTM_DELNEIGH, 0, socket.AF_INET, ifindex, dst=ip)
