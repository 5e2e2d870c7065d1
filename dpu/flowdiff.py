"""Flow tables compared, and one made equal to another: ``ovs-ofctl diff-flows``
and ``replace-flows``.

A flow is known by its table, priority and match, as in OpenFlow; two flows
of the same key differ when their cookie or actions do (timeouts are always
0 in dpu). A group is known by its id and differs by its text. Everything is
compared in the normalised text ``dump_flows`` and ``dump_groups`` give, so
two spellings of one flow are one flow: a flows file is read by loading it
into a scratch :class:`~dpu.dataplane.Dataplane` that has the ports of the
dataplane it is compared with (same names, numbers and tunnels), whose
errors name the file and line as ``dpu flows`` does.

:func:`replace` changes only the difference, in one transaction: groups the
file adds or changes first, then flows deleted (strict), modified (strict,
with the file's cookie: counters and age kept) and added, then groups the
file no longer has. An unchanged flow is not touched: it keeps its counters,
its age and the workers' cached megaflows.

Used by: Dataplane.replace_flows and diff_flows, the control socket's
replace-flows and flow-table commands, ``dpu replace-flows`` and
``dpu diff-flows``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

FlowKey = Tuple[int, int, str]  # table, priority, match (without the priority)


@dataclass
class FlowTable:
    """What a dataplane's tables hold, as text: flows by key, groups by id."""

    flows: Dict[FlowKey, Tuple[int, str]] = field(default_factory=dict)  # key -> (cookie, actions)
    groups: Dict[int, str] = field(default_factory=dict)                 # group_id -> text

    def as_json(self) -> dict:
        """For the control socket: lists, as JSON has no tuple keys."""
        return {"flows": [[t, p, m, c, a] for (t, p, m), (c, a) in self.flows.items()],
                "groups": [[g, text] for g, text in self.groups.items()]}

    @classmethod
    def from_json(cls, d: dict) -> "FlowTable":
        return cls({(t, p, m): (c, a) for t, p, m, c, a in d["flows"]}, {g: text for g, text in d["groups"]})


def _match_only(match: str, priority: int) -> str:
    """A dumped match without its leading ``priority=N`` item (the key carries it)."""
    head = f"priority={priority}"
    if match == head:
        return ""
    return match[len(head) + 1:] if match.startswith(head + ",") else match


def table_of(dp) -> FlowTable:
    """The flows and groups `dp` holds now."""
    t = FlowTable()
    for f in dp.dump_flows():
        t.flows[(f.table, f.priority, _match_only(f.match, f.priority))] = (f.cookie, f.actions)
    for g in dp.dump_groups():
        t.groups[g.group_id] = g.text
    return t


def read_table(scratch, numbered: Sequence[Tuple[int, str]], path: Optional[str],
               ports: Iterable[dict] = ()) -> FlowTable:
    """The table a flows file makes (its (line, text) pairs, read_flows_file()), loaded
    into `scratch`, a new Dataplane, with `ports` (port_info() dicts: a running dpu's,
    so that names, numbers and tunnels are its own); without ports, those the file names."""
    given = sorted(ports, key=lambda p: p["ofport"])
    if given:
        with scratch.transaction() as t:
            for p in given:  # (numbers kept; a tunnel's underlay comes before it)
                if p.get("tunnel"):
                    t.add_ports.append(dict(p))
                else:
                    t.add_port(p["name"], p["ofport"])
    scratch.load_numbered_flows(numbered, path, create_ports=not given)
    return table_of(scratch)


@dataclass
class Difference:
    """What differs from `old` to `new`: keys added, changed and removed."""

    flows_added: List[FlowKey]
    flows_modified: List[FlowKey]
    flows_deleted: List[FlowKey]
    groups_added: List[int]
    groups_modified: List[int]
    groups_deleted: List[int]
    flows_unchanged: int

    def __bool__(self) -> bool:
        return bool(self.flows_added or self.flows_modified or self.flows_deleted or self.groups_added
                    or self.groups_modified or self.groups_deleted)

    def counts(self) -> dict:
        return {k: len(v) if isinstance(v, list) else v for k, v in vars(self).items()}


def _order(key: FlowKey) -> tuple:
    """dump-flows' order: table, then highest priority first, then the match."""
    return key[0], -key[1], key[2]


def compare(old: FlowTable, new: FlowTable) -> Difference:
    flows_added = sorted((k for k in new.flows if k not in old.flows), key=_order)
    flows_modified = sorted((k for k in new.flows if k in old.flows and new.flows[k] != old.flows[k]), key=_order)
    flows_deleted = sorted((k for k in old.flows if k not in new.flows), key=_order)
    return Difference(
        flows_added, flows_modified, flows_deleted,
        sorted(g for g in new.groups if g not in old.groups),
        sorted(g for g in new.groups if g in old.groups and new.groups[g] != old.groups[g]),
        sorted(g for g in old.groups if g not in new.groups),
        sum(1 for k in new.flows if old.flows.get(k) == new.flows[k]),
    )


def selector(key: FlowKey, cookie: int = 0) -> str:
    """table, priority, cookie (when not 0) and match, in ovs-ofctl syntax: one flow's
    strict selector (del-flows --strict), or the head of its text."""
    table, priority, match = key
    return ",".join([f"table={table}", f"priority={priority}"] + ([f"cookie={cookie:#x}"] if cookie else [])
                    + ([match] if match else []))


def flow_text(key: FlowKey, cookie: int, actions: str) -> str:
    """The flow in ovs-ofctl syntax, as a flows file has it."""
    return f"{selector(key, cookie)},actions={actions}"


def diff_lines(old: FlowTable, new: FlowTable) -> List[str]:
    """ovs-ofctl diff-flows: what only `old` has, prefixed '-', what only `new` has,
    '+'; a flow or group in both that differs, both versions ('-' then '+').
    Groups first (a flows file lists them first), then flows in dump-flows order."""
    out = []
    for g in sorted(set(old.groups) | set(new.groups)):
        a, b = old.groups.get(g), new.groups.get(g)
        if a != b:
            out += ([f"-{a}"] if a is not None else []) + ([f"+{b}"] if b is not None else [])
    for k in sorted(set(old.flows) | set(new.flows), key=_order):
        a, b = old.flows.get(k), new.flows.get(k)
        if a != b:
            out += ([f"-{flow_text(k, *a)}"] if a is not None else []) + ([f"+{flow_text(k, *b)}"] if b is not None else [])
    return out


def replace(dp, new: FlowTable) -> dict:
    """Makes `dp`'s tables `new` with the fewest changes, in one transaction (see the
    module docstring); returns what changed (counts, flows_unchanged too) and the
    version in force."""
    d = compare(table_of(dp), new)
    if d:
        t = dp.transaction()
        for g in d.groups_added:
            t.add_group(new.groups[g])
        for g in d.groups_modified:
            t.mod_group(new.groups[g])
        for k in d.flows_deleted:
            t.del_flows(selector(k), strict=True)
        for k in d.flows_modified:  # cookie= always: a mod sets it, 0 included (it never selects)
            cookie, actions = new.flows[k]
            t.mod_flows(f"{selector(k)},cookie={cookie:#x},actions={actions}", strict=True)
        for k in d.flows_added:
            t.add_flow(flow_text(k, *new.flows[k]))
        for g in d.groups_deleted:
            t.del_groups(f"group_id={g}")
        t.commit()
    return {**d.counts(), "version": dp.version}


def source_kind(name: str) -> str:
    """diff-flows' sources, as ovs-ofctl tells a switch from a file: ``unix:PATH`` or a
    path that is a unix socket is a running dpu ("ctl"); anything else, a flows file."""
    import os
    import stat

    if name.startswith("unix:"):
        return "ctl"
    try:
        return "ctl" if stat.S_ISSOCK(os.stat(name).st_mode) else "file"
    except OSError:
        return "file"
