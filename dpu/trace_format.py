"""Text rendering of a :class:`dpu.dataplane.Trace`, in the shape of
``ovs-appctl ofproto/trace`` so OVS users can read it at a glance."""
from __future__ import annotations

from typing import List

RULE = "=" * 79


def _render_pass(p, lines: List[str]) -> None:
    lines.append(f"Flow: {p.flow}")
    lines.append("")
    lines.append('bridge("dpu")')
    lines.append("-------------")
    for ev in p.events:
        pad = "    " * ev["depth"]
        kind = ev["kind"]
        if kind == "table":
            head = f"{pad}{ev['table']:2d}. "
            match = ev["text"]
            head += (match + ", " if match else "") + f"priority {ev['priority']}"
            if ev["cookie"]:
                head += f", cookie {ev['cookie']:#x}"
            lines.append(head)
        elif kind == "miss":
            lines.append(f"{pad}{ev['table']:2d}. No match.")
            lines.append(f"{pad}    drop")
        elif kind == "action":
            lines.append(f"{pad}    {ev['text']}")
        else:
            lines.append(f"{pad}     >> {ev['text']}")
    lines.append("")
    lines.append(f"Final flow: {p.final_flow}")
    lines.append(f"Megaflow: {p.megaflow}")
    lines.append(f"Datapath actions: {p.datapath_actions}")
    for c in p.conntrack:
        lines.append(f"  {c}")


def render_trace(trace) -> str:
    lines: List[str] = []
    for i, p in enumerate(trace.passes):
        if i:
            if p.recirc_id:
                head = f"recirc({p.recirc_id:#x}) - resume conntrack with its state in the key"
            else:
                head = f"tunnel pop: looked up again with in_port={p.in_port}"
            lines += ["", RULE, head, RULE]
        _render_pass(p, lines)
    lines.append("")
    if trace.outputs:
        for port, data in trace.outputs:
            lines.append(f"Output: {port} ({len(data)} bytes)")
    else:
        lines.append(f"Dropped: {trace.drop_reason or 'no_output'}")
    return "\n".join(lines)
