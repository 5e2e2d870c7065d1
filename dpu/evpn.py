"""dpu run's fabric: the kernel shadow, FRRouting, and the mirror that keeps the flows equal
to what FRR installed (issue 28; docs/fabric.md).

What it does, for a topology with an ``evpn:`` section:
  1. guards the uplink: an nftables ingress rule drops VXLAN to the kernel after dpu's
     packet socket has seen it (the kernel's VXLAN socket neither answers nor decapsulates);
  2. builds the kernel shadow (``dpu.fabric.shadow.Shadow``): per tenant a VRF, a bridge
     with its VXLAN device and SVI (the anycast gateways), the L3 VNI, and a representor
     with a static FDB entry and a permanent neighbour for each local port;
  3. with ``frr: managed``, renders FRR's configuration (``dpu.fabric.frr.render``, as NVUE
     does for HBN), starts zebra and bgpd with their state in ``<ctl>.frr/`` and re-signals
     the local neighbours once zebra is up; with ``external`` the operator's FRR is used,
     found by its run directory (``frr_dir``), and the neighbours are re-signalled whenever
     a new zebra appears there and knows the tenants' VNIs;
  4. reads what FRR installed and commits it (``dpu.mirror.FabricMirror``), then watches the
     shadow: each burst of netlink events becomes one read and one transaction.
A reload re-applies the shadow (ports gone are withdrawn), re-renders FRR's configuration
and recompiles the learned entries against the new tenants. ``close`` undoes all of it.

Who calls it: ``dpu.live.Instance`` (open/start/reload/close) and the control socket
(``view``). Thread-safety: the watch thread and reloads serialise on ``lock``.
"""
from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from typing import Any, Dict, List, Optional, Set

from .errors import FabricError
from .mirror import FabricMirror, evpn_view
from .topology import Topology

log = logging.getLogger("dpu.evpn")
HOLD_AFTER_UP_S = 3.0   # after FRR's sessions are back, quiet time for its routes before syncing again
RESIGNAL_WAIT_S = 5.0   # at start, how long dpu waits for its zebra to know the VNIs (then housekeeping does)


def shadow_tenants(topo: Topology) -> List[Any]:
    """The kernel shadow of a topology's tenants (one L2 VNI each, and its L3 VNI)."""
    from .fabric.shadow import ShadowPort, ShadowSubnet, ShadowTenant

    out = []
    for t in topo.tenants.values():
        gws = tuple(f"{gw}/{net.prefixlen}" for net, gw in t.subnets)
        ports = tuple(ShadowPort(name=p, vni=t.vni, mac=ep.mac, ip=str(ep.ip)) for p, ep in t.ports.items())
        out.append(ShadowTenant(name=t.name, l3vni=t.l3vni or 0, router_mac=topo.evpn.router_mac,
                                subnets=(ShadowSubnet(vni=t.vni, gateway_mac=t.gateway_mac, gateways=gws),),
                                ports=ports))
    return out


def frr_confs(topo: Topology, tenants: List[Any]) -> Dict[str, str]:
    from .fabric.frr import Peer, render

    ev = topo.evpn
    peers = [Peer(str(p.address), p.remote_asn) for p in ev.peers]
    return render(ev.asn, str(ev.router_id), peers, tenants, graceful_restart=ev.graceful_restart)


class EvpnService:
    """The fabric of one running dpu."""

    def __init__(self, dp: Any, topo: Topology, uplink_ifname: str, ctl: Optional[str]) -> None:
        self.dp = dp
        self.topo = topo
        self.uplink_ifname = uplink_ifname
        where = os.path.abspath(os.fspath(ctl)) if ctl else f"pid{os.getpid()}"
        # Stable for a control socket: a restarted dpu finds (adopts) its shadow again.
        self.tag = "dpu" + hashlib.sha1(where.encode()).hexdigest()[:8]
        self.state_dir = (os.fspath(ctl) + ".frr") if ctl else None
        self.mirror = FabricMirror(dp, topo)
        self.lock = threading.Lock()
        self.shadow = None
        self.frr = None
        self._unguard = None
        self.errors = 0               # reads or commits that failed (logged)
        self.last_error: Optional[str] = None
        self.restarts = 0             # times a managed FRR was found dead and restarted
        self.held_since: Optional[float] = None   # FRR down: learned entries held since then
        self._up_since: Optional[float] = None
        self.external_zebra: Optional[int] = None   # frr: external: the zebra whose neighbours were re-signalled
        self.resignal_pending = False   # frr: managed: started, its zebra not yet told our neighbours

    # ---- start and stop ----------------------------------------------------------------
    def start(self) -> None:
        from .fabric.shadow import Shadow
        from .fabric.underlay import guard_vxlan

        u = self.topo.uplink
        try:
            self._unguard = guard_vxlan(self.uplink_ifname, u.vxlan_port, None)
            self.shadow = Shadow(self.tag, str(u.ip), u.vxlan_port)
            tenants = shadow_tenants(self.topo)
            self.shadow.apply(tenants)
            if self.topo.evpn.frr == "managed":
                self._start_frr(tenants)
            else:
                from .fabric.frr import ExternalFrr
                self.frr = ExternalFrr(self.topo.evpn.frr_dir, name="the operator's FRR")
                self._external_rounds()
            self.sync()
            self.shadow.watch(lambda tenants: self._changed(tenants, self.shadow.batch_since(), watched=True))
        except Exception:
            self.close()
            raise

    def _start_frr(self, tenants: List[Any]) -> None:
        from .fabric.frr import ManagedFrr

        if self.state_dir is None:
            raise FabricError("evpn: frr: managed needs dpu run's control socket (--ctl): FRR's state lives beside it")
        self.frr = ManagedFrr(self.state_dir, None, self.shadow.namespaces(), frr_confs(self.topo, tenants))
        self.frr.start()
        self._resignal_when_zebra_knows(wait=RESIGNAL_WAIT_S)

    def _resignal_when_zebra_knows(self, wait: float = 0.0) -> None:
        """zebra reads permanent neighbours written before it started only when told again, and
        takes one only for a VNI it already knows, which it learns from bgpd after both have
        started: re-signalled earlier, a tenant's MAC+IP routes never went out. So the local
        neighbours of a started managed FRR are re-signalled once its zebra knows every tenant's
        VNI: waited for up to `wait` seconds here, else in housekeeping's rounds."""
        self.resignal_pending = True
        deadline = time.monotonic() + wait
        while True:
            missing = self._vnis_zebra_lacks()
            if not missing:
                self.shadow.resignal()
                if not wait:
                    log.info("evpn: FRR's zebra knows our VNIs now: local neighbours re-signalled")
                self.resignal_pending = False
                return
            if time.monotonic() >= deadline:
                if wait:  # (housekeeping's rounds, with no wait, would say it twice a second)
                    log.info("evpn: FRR's zebra does not know VNIs %s yet: local neighbours re-signalled once it "
                             "does", sorted(missing))
                return
            time.sleep(0.05)

    def _vnis_zebra_lacks(self) -> Set[int]:
        """The tenants' VNIs FRR's zebra does not know yet (all of them while it does not answer)."""
        want = {t.vni for t in self.topo.tenants.values()}
        try:
            return want - self.frr.vnis()
        except FabricError:
            return want

    def close(self) -> None:
        for step in (lambda: self.shadow and self.shadow.stop(), lambda: self.frr and self.frr.stop(),
                     lambda: self._unguard and self._unguard(), lambda: self.shadow and self.shadow.destroy()):
            try:
                step()
            except Exception as e:  # close everything it can; say what it could not
                log.warning("evpn: while stopping: %s", e)
        self.shadow = self.frr = self._unguard = None

    # ---- FRR down: what it installed stays in force -------------------------------------
    def housekeeping(self) -> None:
        """Called about twice a second by dpu run. A managed FRR that died is restarted; until
        its sessions are back (and a few quiet seconds have passed for the routes to come
        back) the learned entries stay in force: zebra flushes them from the kernel when bgpd
        dies, which is not the fabric withdrawing them, and established flows keep going."""
        frr = self.frr
        if frr is None:
            return
        if self.topo.evpn.frr == "external":
            self._external_rounds()
        elif not frr.alive():
            with self.lock:
                self.held_since = self.held_since or time.monotonic()
            log.warning("evpn: FRR is not running; learned entries stay in force; restarting it")
            try:
                frr.stop()
                frr.start()
                self._resignal_when_zebra_knows()
                self.restarts += 1
            except Exception as e:
                self.errors += 1
                self.last_error = str(e)
                log.error("evpn: could not restart FRR: %s", e)
            return
        if self.resignal_pending and frr.alive():
            self._resignal_when_zebra_knows()
        if self.held_since is None or not frr.alive():
            return
        try:
            up = frr.established()
        except Exception:
            return
        if up and all(up.values()):
            if self._up_since is None:
                self._up_since = time.monotonic()
            elif time.monotonic() - self._up_since >= HOLD_AFTER_UP_S:
                with self.lock:
                    self.held_since = None
                    self._up_since = None
                self._changed(None)
        else:
            self._up_since = None

    def _external_rounds(self) -> None:
        """The operator's FRR: while it is down, what it installed stays in force (held, as for
        a managed FRR, but dpu does not start it); once a zebra dpu has not re-signalled yet
        runs and knows every tenant's VNI, the local neighbours are re-signalled for it."""
        frr = self.frr
        if not frr.alive():
            if self.held_since is None:
                with self.lock:
                    self.held_since = time.monotonic()
                    self._up_since = None
                log.warning("evpn: the operator's FRR is not running (nothing live in %s): learned entries stay "
                            "in force until it is back", frr.dir)
            return
        zebra = frr.pid("zebra")
        if zebra is None or zebra == self.external_zebra:
            return
        if not self._vnis_zebra_lacks():
            self.shadow.resignal()
            self.external_zebra = zebra
            log.info("evpn: the operator's zebra (pid %d) knows our VNIs: local neighbours re-signalled", zebra)

    # ---- what FRR installed -> the dataplane -------------------------------------------
    def _changed(self, _tenants, since: Optional[float] = None, watched: bool = False) -> None:
        frr = self.frr
        if frr is not None and self.held_since is None and not frr.alive():
            # bgpd died and zebra is flushing what it installed: not a withdrawal
            self.held_since = time.monotonic()
            log.warning("evpn: FRR is not running; learned entries stay in force until it is back")
        if self.held_since is not None:
            return        # FRR is coming back: keep what is in force (housekeeping syncs after)
        try:
            self.sync(since, watched=watched)
        except Exception as e:   # the watch thread must live on: the next event retries
            self.errors += 1
            self.last_error = str(e)
            log.error("evpn: could not apply what the fabric learned: %s", e)

    def sync(self, since: Optional[float] = None, watched: bool = False) -> dict:
        """Commits the difference between every tenant's learned entries and what is in force
        (one transaction). ``watched``: called by the shadow's watch, whose events keep the
        entries (no dump; a tenant it could not watch is read); else read from the kernel.
        ``since``: when the netlink events that asked for it began to be read (the latency)."""
        with self.lock:
            if self.shadow is None:
                return {}
            learned = self.shadow.watched() if watched else None
            return self.mirror.apply(self.shadow.read() if learned is None else learned, since)

    def reload(self, topo: Topology) -> None:
        """The topology was reloaded (its flows already committed)."""
        with self.lock:
            self.topo = topo
            tenants = shadow_tenants(topo)
            self.shadow.apply(tenants)
            if self.frr is not None and topo.evpn.frr == "managed":
                confs = frr_confs(topo, tenants)
                if confs != self.frr.confs:
                    # FRR restarts to take it: hold what is in force until it is back (housekeeping)
                    self.held_since = self.held_since or time.monotonic()
                    self._up_since = None
                    self.frr.reload(confs, self.shadow.namespaces())
                    self._resignal_when_zebra_knows()
            self.mirror.retopology(topo)

    # ---- what dpu evpn and the metrics show -------------------------------------------
    def view(self) -> dict:
        v = evpn_view(self.topo, self.mirror)
        v["vrfs"] = self.shadow.namespaces() if self.shadow is not None else {}
        if self.frr is not None:
            v["frr_dir"] = self.frr.dir
            try:
                v["sessions"] = self.frr.established()
            except Exception as e:
                v["sessions_error"] = str(e)
        v["errors"] = self.errors
        v["frr_restarts"] = self.restarts
        v["held"] = self.held_since is not None
        return v

    def metrics(self) -> dict:
        snap = self.mirror.snapshot()
        last = snap["last_change"]
        return {"learned": snap["tenants"], "skipped": snap["skipped"], "transactions": snap["transactions"],
                "seconds_since_change": (time.time() - last) if last else None, "errors": self.errors,
                "latency": snap["latency"]}
