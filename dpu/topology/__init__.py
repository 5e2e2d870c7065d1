"""Tenant topology files: reading, validation and compilation into flows.

A topology (YAML; schema in the README, "Tenant topology") describes the uplink
(our VTEP), and per tenant a VNI, an anycast gateway, subnets, local ports and
remote endpoints (EVPN type-2) and flood VTEPs (type-3). It compiles into
ordinary ovs-ofctl flows and groups, which users can print (``dpu compile``)
and extend with flows of their own.

Three steps, one module each, each handing the next only what it accepted:

  reader    the strict YAML reader: file, text or dict -> plain data, with the
            line and column of every key and value; a key written twice, an
            alias (``*name``), a tag, or nesting deeper than MAX_DEPTH is an
            error. It also collects a load's errors and raises them together.
  schema    the topology's types (Uplink, Tenant, Nat, ...) and their
            validation: data -> Topology, every mistake named by its key path
            (``tenants.red.ports.vm3.ip: ...``) and, for YAML, its file, line and
            column (``topo.yaml:12:27: tenants.red.ports.vm3.ip: ...``).
            ``load_topology`` runs the reader and the schema.
  compiler  Topology -> Compiled (ports, groups, flows, tenants, conntrack
            zones, NAT mappings); it checks nothing and raises nothing.

Validation happens before anything is applied; nothing here touches a
dataplane (``Dataplane.load_topology`` applies a Compiled). This module is the
package's public face: callers import from ``dpu.topology``, not from its parts.
"""
from .compiler import (EVPN_FLOOD_GROUP, PROTO_NUMBERS, T_FABRIC, T_INET_IN, T_INET_IN_CT, T_INET_IN_ROUTE,
                       T_INGRESS, T_L2, T_L3, T_L3VNI, T_NAT_OUT, T_NAT_OUT_CT, T_NAT_OUT_ROUTE, TOPOLOGY_COOKIE,
                       TOPOLOGY_COOKIE_MASK, UNRESOLVED_MAC, Compiled, compile_topology)
from .reader import MAX_DEPTH, MAX_ERRORS, MAX_FILE_BYTES
from .schema import TUNNEL_PORT, Endpoint, Evpn, Forward, Internet, Nat, Peer, Tenant, Topology, Uplink, load_topology

__all__ = [
    "EVPN_FLOOD_GROUP", "MAX_DEPTH", "MAX_ERRORS", "MAX_FILE_BYTES", "PROTO_NUMBERS", "TOPOLOGY_COOKIE",
    "TOPOLOGY_COOKIE_MASK", "TUNNEL_PORT", "T_FABRIC", "T_INET_IN", "T_INET_IN_CT", "T_INET_IN_ROUTE", "T_INGRESS",
    "T_L2", "T_L3", "T_L3VNI", "T_NAT_OUT", "T_NAT_OUT_CT", "T_NAT_OUT_ROUTE", "UNRESOLVED_MAC", "Compiled",
    "Endpoint", "Evpn", "Forward", "Internet", "Nat", "Peer", "Tenant", "Topology", "Uplink", "compile_topology",
    "load_topology",
]
