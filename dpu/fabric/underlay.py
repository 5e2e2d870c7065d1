"""Keeping the kernel's VXLAN socket from answering: VXLAN to the underlay address is dpu's.

The shadow's VXLAN devices must stay up (zebra advertises nothing for a VNI whose device is
down), so the kernel holds a UDP socket on the VXLAN port in the underlay namespace: it would
decapsulate what arrives there, answer it through the shadow (an echo to a gateway came back
over the L3 VNI), or, with no device up, send ICMP port unreachable (tests/EVPN_LAB.md,
"Surprises"). dpu on AF_XDP takes the frames before the stack; dpu on AF_PACKET gets a copy
from its packet socket, so the kernel's own copy must die after that: an nftables `netdev`
table with an ingress chain on the uplink dropping UDP to the VXLAN port. The netdev ingress
hook runs after packet taps (the packet socket sees the frame) and before IP, so the kernel
neither answers nor decapsulates; BGP (TCP), ARP and ICMP to the underlay address stay the
kernel's. tc cannot do it on this kernel (no flower classifier, no gact action).

`guard_vxlan()` installs the table atomically (one `nft -f`, replacing a table a killed run
left), registers its removal with dpu.cleanup, and returns the undo.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from typing import Callable, Optional

from .. import cleanup
from ..errors import FabricError, InvalidArgumentError

SBIN = ("/usr/sbin", "/sbin")     # where nft lives on Debian, often not on a user's PATH
_IFNAME = re.compile(r"[A-Za-z0-9_.:@-]{1,15}")


def table_name(ifname: str) -> str:
    """The nftables table (family netdev) guarding ifname."""
    return "dpu_vxlan_" + re.sub(r"[^A-Za-z0-9_]", "_", ifname)


def _nft_cmd(netns: Optional[str], what: str) -> list:
    nft = shutil.which("nft", path=os.pathsep.join([os.environ.get("PATH", ""), *SBIN]))
    if nft is None:
        raise FabricError(f"{what}: nft is not installed (apt-get install nftables): dpu needs it to keep "
                          "the kernel from answering VXLAN on the uplink")
    return (["ip", "netns", "exec", netns] if netns else []) + [nft]


def _nft(netns: Optional[str], script: str, what: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(_nft_cmd(netns, what) + ["-f", "-"], input=script, capture_output=True, text=True)
    if check and r.returncode != 0:
        raise FabricError(f"{what}: nft refused it: {r.stderr.strip() or f'exit status {r.returncode}'}")
    return r


def guard_vxlan(ifname: str, port: int = 4789, netns: Optional[str] = None) -> Callable[[], None]:
    """Drops UDP to `port` arriving on `ifname` (in `netns`; None: this process's) after packet
    sockets have seen it; returns the undo (idempotent). FabricError if nft is missing or
    refuses (no such interface)."""
    if not isinstance(ifname, str) or not _IFNAME.fullmatch(ifname):
        raise InvalidArgumentError(f"ifname {ifname!r} is not an interface name")
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise InvalidArgumentError(f"port {port!r} is not a UDP port (1 to 65535)")
    table = table_name(ifname)
    what = f"guarding VXLAN port {port} on {ifname}" + (f" in {netns}" if netns else "")
    script = (f"table netdev {table}\n"
              f"delete table netdev {table}\n"
              f"table netdev {table} {{\n"
              f"  chain ingress {{\n"
              f"    type filter hook ingress device \"{ifname}\" priority 0; policy accept;\n"
              f"    udp dport {port} counter drop\n"
              f"  }}\n"
              f"}}\n")

    def undo() -> None:
        _nft(netns, f"table netdev {table}\ndelete table netdev {table}\n", what, check=False)

    with cleanup.deferred():
        _nft(netns, script, what)
        handle = cleanup.register(undo)
    return handle.run


def dropped(ifname: str, netns: Optional[str] = None) -> int:
    """Packets the guard on ifname dropped so far (its counter)."""
    cmd = _nft_cmd(netns, f"reading the VXLAN guard on {ifname}") + ["-j", "list", "table", "netdev",
                                                                       table_name(ifname)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise FabricError(f"no VXLAN guard on {ifname}: {r.stderr.strip()}")
    return sum(e["counter"]["packets"] for item in json.loads(r.stdout)["nftables"] if "rule" in item
               for e in item["rule"]["expr"] if "counter" in e)
