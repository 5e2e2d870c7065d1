"""The one scapy-expression evaluator: ``dpu trace``'s packet argument, ``dpu gen``'s
template, and the tests all build packets through :func:`evaluate`.

An offline tool stays offline and deterministic. Scapy fills an unset
address from the host it runs on: the Ethernet source from the outgoing
interface, the Ethernet destination by resolving the gateway (it sends a
real ARP request or neighbour solicitation to do so), the IP source from the
routing table. :func:`offline_defaults` sets every such field the expression
leaves unset, in every layer (an inner Ethernet/IP of a tunnel too), to a
fixed value before anything is built:

=====================  ======================  ==============================
field (scapy)          OpenFlow name           default
=====================  ======================  ==============================
Ether.dst, Dot3.dst    dl_dst                  ff:ff:ff:ff:ff:ff
Ether.src, Dot3.src    dl_src                  00:00:00:00:00:00
IP.src                 nw_src                  0.0.0.0
IPv6.src               ipv6_src                ::
ARP.hwsrc              arp_sha                 00:00:00:00:00:00
ARP.psrc               arp_spa                 0.0.0.0
=====================  ======================  ==============================

These are what scapy itself gives on a machine without a network. Every other
field keeps scapy's own fixed default (IP dst 127.0.0.1, UDP ports 53, ...).

The expression is Python evaluated with the names of ``scapy.all`` and no
builtins: it is ``eval``, give it trusted text only (your own command line).
"""
from __future__ import annotations

from typing import Any, Dict, Optional

from .errors import InvalidArgumentError

#: The fixed defaults, by the kind of host-derived scapy field.
DEFAULTS = {
    "dst_mac": "ff:ff:ff:ff:ff:ff",
    "src_mac": "00:00:00:00:00:00",
    "src_ip": "0.0.0.0",
    "src_ip6": "::",
}

_names: Optional[Dict[str, Any]] = None


def _scapy():
    import scapy.all as S  # imported lazily: it takes a second

    return S


def names() -> Dict[str, Any]:
    """The namespace expressions see: every public name of ``scapy.all``."""
    global _names
    if _names is None:
        S = _scapy()
        _names = {k: v for k, v in vars(S).items() if not k.startswith("_")}
    return _names


def _kind(fld, layer) -> Optional[str]:
    """Which fixed default a field takes, or None for a field scapy fills
    without looking at the host."""
    from scapy import fields as F
    from scapy.layers.l2 import DestMACField, SourceMACField

    while True:
        if isinstance(fld, F.MultipleTypeField):
            # the alternative an unset value takes (ARP: by hwtype and ptype)
            fld = fld._find_fld_pkt_val(layer, None)[0]
        elif isinstance(fld, F.Emph):
            fld = fld.fld
        else:
            break
    if isinstance(fld, DestMACField):
        return "dst_mac"
    if isinstance(fld, SourceMACField):  # ARPSourceMACField too
        return "src_mac"
    if isinstance(fld, F.SourceIP6Field):
        return "src_ip6"
    if isinstance(fld, F.SourceIPField):
        return "src_ip"
    return None


def offline_defaults(pkt):
    """Sets the host-derived fields ``pkt`` leaves unset (in every layer) to
    :data:`DEFAULTS`; returns ``pkt`` (changed in place)."""
    S = _scapy()
    layer = pkt
    while layer is not None and not isinstance(layer, S.NoPayload):
        for fld in layer.fields_desc:
            if layer.fields.get(fld.name) is not None:
                continue  # the user's value
            kind = _kind(fld, layer)
            if kind is not None:
                setattr(layer, fld.name, DEFAULTS[kind])
        layer = layer.payload
    return pkt


def _error(what: str, expr: str, reason: str) -> InvalidArgumentError:
    """``WHAT 'EXPR': REASON``; ``reason`` alone is the exception's ``reason``."""
    return InvalidArgumentError(f"{what} {expr!r}: {reason}", reason=reason)


def _where(expr: str, e: SyntaxError) -> str:
    col = f" at column {e.offset}" if e.offset else ""
    return f"{e.msg}{col}"


def evaluate(expr: str, what: str = "packet expression"):
    """The scapy packet ``expr`` describes, with :func:`offline_defaults`
    applied. Errors are :class:`~dpu.errors.InvalidArgumentError` naming
    ``what`` and the expression."""
    if not isinstance(expr, str):
        raise InvalidArgumentError(f"{what} must be a string, not {type(expr).__name__}")
    if not expr.strip():
        raise InvalidArgumentError(f"{what} is empty", reason="it is empty")
    S = _scapy()
    try:
        code = compile(expr, f"<{what}>", "eval")
    except SyntaxError as e:
        raise _error(what, expr, _where(expr, e)) from None
    except ValueError as e:  # a NUL in the text
        raise _error(what, expr, str(e)) from None
    try:
        pkt = eval(code, {"__builtins__": {}}, names())  # noqa: S307 - the user's own expression
    except Exception as e:  # noqa: BLE001 - any error in the user's expression, reported plainly
        raise _error(what, expr, f"{type(e).__name__}: {e}") from None
    if not isinstance(pkt, S.Packet):
        raise InvalidArgumentError(f"{what} {expr!r} gives a {type(pkt).__name__}, not a scapy packet",
                                   reason=f"it gives a {type(pkt).__name__}, not a scapy packet")
    return offline_defaults(pkt)


def build(expr: str, what: str = "packet expression") -> bytes:
    """The bytes of :func:`evaluate`'s packet."""
    pkt = evaluate(expr, what)
    try:
        return bytes(pkt)
    except Exception as e:  # noqa: BLE001 - scapy's error while building the user's packet
        raise _error(what, expr, f"it does not build: {type(e).__name__}: {e}") from None
