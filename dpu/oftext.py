"""Fields of ovs-ofctl text lines, for the views' ``--json``.

The core writes flows and groups as canonical ovs-ofctl text (``offormat.cc``);
the topology compiler writes flows files in the same syntax. A view that
prints such lines prints, with ``--json``, the same lines as fields under the
names the text uses, and these functions split them. They read text the core
or the compiler wrote (canonical: a match has no parentheses, a group's
buckets follow its properties); they check nothing: parsing a flow a user
wrote is the core's (``Dataplane.add_flow``).
"""
from __future__ import annotations

from typing import Any, Dict

DEFAULT_PRIORITY = 32768  # as Open vSwitch's, when a flow names none


def flow_fields(text: str) -> Dict[str, Any]:
    """``table=0,priority=200,cookie=0x1,in_port=p0,arp,actions=drop`` (a flows-file line) as
    {table, priority, cookie (hex, as written), match (the rest, in order), actions}."""
    head, sep, actions = text.partition(",actions=")
    if not sep and text.startswith("actions="):
        head, actions = "", text[len("actions="):]
    d: Dict[str, Any] = {"table": 0, "priority": DEFAULT_PRIORITY, "cookie": "0x0"}
    match = []
    for item in filter(None, head.split(",")):
        k, _, v = item.partition("=")
        if k in ("table", "priority"):
            d[k] = int(v, 0)
        elif k == "cookie":
            d[k] = f"{int(v.split('/')[0], 0):#x}"
        else:
            match.append(item)
    d["match"] = ",".join(match)
    d["actions"] = actions
    return d


def group_fields(text: str) -> Dict[str, Any]:
    """``group_id=1,type=select,bucket=bucket_id:0,weight:10,actions=output:p1,bucket=...`` as
    {group_id, type, buckets: [{bucket_id, weight, actions}, ...]} (a bucket's properties as
    it has them)."""
    head, *buckets = text.split(",bucket=")
    d: Dict[str, Any] = {}
    for item in filter(None, head.split(",")):
        k, _, v = item.partition("=")
        d[k] = int(v, 0) if k == "group_id" else v
    d["buckets"] = [_bucket(b) for b in buckets]
    return d


def _bucket(text: str) -> Dict[str, Any]:
    props, _, actions = text.partition("actions=")
    b: Dict[str, Any] = {}
    for item in filter(None, props.split(",")):
        k, _, v = item.partition(":")
        b[k] = int(v) if v.isdigit() else v
    b["actions"] = actions
    return b


__all__ = ["flow_fields", "group_fields"]
