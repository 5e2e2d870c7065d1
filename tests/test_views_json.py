"""`--json` on every view (issue 30): each parses and carries what its text shows for the same
state, field by field. Offline from examples/: compile, flows, show, ct dump after a replay,
gen. Live, against one `dpu run` in a network namespace (root only; skipped otherwise):
dump-flows, dump-groups, ct dump --ctl and show, with the log of that run in
--log-format json (tests/test_logs.py has the formats themselves).
"""
import json
import os
import re
import subprocess
import sys

import pytest

from dpu.cli import main
from helpers.wait import wait_for

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOPO = os.path.join(ROOT, "examples", "topology.yaml")
NAT_TOPO = os.path.join(ROOT, "examples", "nat-gateway.yaml")
SG_TOPO = os.path.join(ROOT, "examples", "security-groups.yaml")
GW_MAC, VM1_MAC, INET_MAC, INET_NEXTHOP = "02:00:00:00:01:01", "02:00:00:00:01:11", "02:00:00:00:00:31", "02:00:00:00:00:32"

# ---- the text, read as a reader would ------------------------------------------------------------

FLOW_LINE = re.compile(r"cookie=(?P<cookie>0x[0-9a-f]+), duration=(?P<duration>[0-9.]+)s, table=(?P<table>\d+), "
                       r"n_packets=(?P<n_packets>\d+), n_bytes=(?P<n_bytes>\d+), (?:(?P<match>\S+) )?"
                       r"actions=(?P<actions>.*)")
CT_LINE = re.compile(r"(?P<proto>\w+),orig=\((?P<orig>[^)]*)\),reply=\((?P<reply>[^)]*)\)(?:,zone=(?P<zone>\d+))?"
                     r"(?:,mark=(?P<mark>\d+))?(?:,labels=(?P<labels>0x[0-9a-f]+))?"
                     r"(?:,protoinfo=\(state=(?P<state>\w+)\))?$")


def flow_from_text(line: str) -> dict:
    """A dump-flows line's fields; priority, when the match starts with it, on its own."""
    m = FLOW_LINE.fullmatch(line)
    assert m, line
    d = m.groupdict()
    match = (d["match"] or "").split(",")
    priority = int(match.pop(0).split("=")[1]) if match[0].startswith("priority=") else 32768
    return {"cookie": d["cookie"], "table": int(d["table"]), "n_packets": int(d["n_packets"]),
            "n_bytes": int(d["n_bytes"]), "priority": priority, "match": ",".join(x for x in match if x),
            "actions": d["actions"]}


def same_flows(text_lines, rows) -> None:
    """The JSON rows are the text's lines, in order, field by field (duration: a number, read later)."""
    assert len(rows) == len(text_lines) > 0
    for line, row in zip(text_lines, rows):
        assert isinstance(row.pop("duration"), float)
        assert row == flow_from_text(line), line


def group_text(g: dict) -> str:
    """A group's line from its JSON fields, as format_group writes it."""
    text = f"group_id={g['group_id']},type={g['type']}"
    for b in g["buckets"]:
        props = "".join(f"{k}:{v}," for k, v in b.items() if k != "actions")
        text += f",bucket={props}actions={b['actions']}"
    return text


def ct_from_text(line: str) -> dict:
    m = CT_LINE.fullmatch(line)
    assert m, line
    d = m.groupdict()
    tuples = {k: dict(x.split("=") for x in d[k].split(",")) for k in ("orig", "reply")}
    return {"proto": d["proto"], **tuples, "zone": int(d["zone"] or 0), "mark": int(d["mark"] or 0),
            "labels": d["labels"] or "0x0", "protoinfo": {"state": d["state"]} if d["state"] else None}


def same_connections(text_lines, rows) -> None:
    assert len(rows) == len(text_lines) > 0
    for line, row in zip(text_lines, rows):
        assert row["expires_in"] > 0 and isinstance(row["snat"], bool) and isinstance(row["dnat"], bool)
        shown = {k: row[k] for k in ("proto", "zone", "mark", "labels", "protoinfo")}
        shown.update({k: {f: str(v) for f, v in row[k].items()} for k in ("orig", "reply")})
        assert shown == ct_from_text(line), line


def run(capsys, *args):
    assert main(list(args)) == 0
    return capsys.readouterr().out


# ---- offline -----------------------------------------------------------------------------------


@pytest.mark.parametrize("topo", [TOPO, NAT_TOPO, SG_TOPO])
def test_compile_json_is_the_listing(capsys, topo):
    text = run(capsys, "compile", topo).splitlines()
    d = json.loads(run(capsys, "compile", topo, "--json"))
    entries, section = [], None  # (line, the comment it is listed under) of every group and flow
    for line in text:
        if line.startswith("# ") and not line.startswith(("# dpu compile", "# ports:", "#   ")):
            section = line[2:]
        elif line and not line.startswith("#"):
            entries.append((line, section))
    groups = [e for e in entries if e[0].startswith("group_id=")]
    flows = [e for e in entries if not e[0].startswith("group_id=")]
    assert [(group_text(g), g["section"]) for g in d["groups"]] == groups
    assert len(d["flows"]) == len(flows)
    for (line, sect), f in zip(flows, d["flows"]):
        head = line[:line.index("actions=")].rstrip(",").split(",")
        assert f["section"] == sect and line.endswith(f"actions={f['actions']}")
        assert f"table={f['table']}" in head and f"priority={f['priority']}" in head, line
        assert int(next(x for x in head if x.startswith("cookie=")).split("=")[1], 0) == int(f["cookie"], 16)
        assert [x for x in head if not x.startswith(("table=", "priority=", "cookie="))] == \
            [x for x in f["match"].split(",") if x], line
    assert d["source"] == topo and d["tunnel"] == "vxlan0" and d["uplink"]["port"] == "p0"
    header = "\n".join(line for line in text if line.startswith("#   tenant"))
    for t in d["tenants"]:
        assert f"#   tenant {t['name']} (vni {t['vni']}, conntrack zone {t['zone']}): {', '.join(t['ports'])}" in header
        if t["nat"]:
            assert f"#   tenant {t['name']} NAT: snat {t['nat']['snat'][0]}" in header
        if t["connection_limit"]:
            assert f"#   tenant {t['name']} connection limit: {t['connection_limit']}" in header


def test_flows_json_is_the_listing(capsys):
    text = run(capsys, "flows", "--config", TOPO).splitlines()
    d = json.loads(run(capsys, "flows", "--config", TOPO, "--json"))
    n = len(d["groups"])
    assert [group_text(g) for g in d["groups"]] == text[:n]
    assert all(g["n_packets"] == 0 and g["n_bytes"] == 0 for g in d["groups"])
    same_flows(text[n:], d["flows"])


def test_show_json_is_the_listing(capsys):
    text = run(capsys, "show", "--config", TOPO).splitlines()
    d = json.loads(run(capsys, "show", "--config", TOPO, "--json"))
    assert sorted(f" {p['ofport']}({p['name']})" + (": tunnel" if p["tunnel"] else "") for p in d["ports"]) == \
        sorted(text)


def _nat_capture(path):
    """vm1 asks a DNS server on the internet (UDP) and opens a TCP connection to a web server."""
    from scapy.all import IP, TCP, UDP, Ether, wrpcap

    out = [Ether(src=VM1_MAC, dst=GW_MAC) / IP(src="10.0.0.11", dst="198.51.100.1") / UDP(sport=5000, dport=53),
           Ether(src=VM1_MAC, dst=GW_MAC) / IP(src="10.0.0.11", dst="198.51.100.2") / TCP(sport=40000, dport=80)]
    for i, p in enumerate(out):
        p.time = 1_700_000_000 + i
    wrpcap(str(path), out)


def test_ct_dump_json_is_the_listing(capsys, tmp_path):
    _nat_capture(tmp_path / "vm1.pcap")
    args = ["ct", "dump", "--config", NAT_TOPO, "--in", f"vm1={tmp_path / 'vm1.pcap'}"]
    text = run(capsys, *args).splitlines()
    d = json.loads(run(capsys, *args, "--json"))
    same_connections(text, d["connections"])
    assert {c["proto"] for c in d["connections"]} == {"udp", "tcp"} and all(c["snat"] for c in d["connections"])


def test_gen_json_is_the_summary(tmp_path):
    """The summary goes where the text goes (stdout, or stderr when the capture is stdout)."""
    out = tmp_path / "t.pcap"
    cmd = [sys.executable, "-m", "dpu.cli", "gen", "Ether()/IP()/UDP()", "-n", "7", "-o", str(out)]
    text = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=120)
    js = subprocess.run(cmd + ["--json"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert text.returncode == 0 and js.returncode == 0, text.stderr + js.stderr
    m = re.fullmatch(r"wrote (\d+) packets to (\S+) in ([0-9.]+)s \(.*\)\n", text.stdout)
    d = json.loads(js.stdout)
    assert m and (d["packets"], d["output"]) == (int(m.group(1)), m.group(2)) == (7, str(out))
    assert d["seconds"] > 0 and d["pps"] > 0
    piped = subprocess.run(cmd[:-1] + ["/dev/stdout", "--json"], capture_output=True, cwd=ROOT, timeout=120)
    assert piped.stdout[2:4] == b"\xb2\xa1" and json.loads(piped.stderr)["packets"] == 7


def test_every_view_takes_json():
    """Every command that prints a view (not one that changes something) has --json."""
    from dpu.cli import _parser

    views = {"demo", "replay", "trace", "ct", "flows", "compile", "gen", "dump-flows", "dump-groups", "stats",
             "show", "evpn", "bench"}
    sub = next(a for a in _parser()._actions if hasattr(a, "choices") and isinstance(a.choices, dict))
    lacking = [name for name in views if "--json" not in sub.choices[name]._option_string_actions]
    assert lacking == []


# ---- live: one dpu run in a namespace ---------------------------------------------------------------


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """`dpu --log-format json run` on examples/nat-gateway.yaml with vm1 on a veth in a namespace of its
    own (IPv6 off there: no kernel chatter moves a counter), after a UDP packet from vm1 to the
    internet went through it (a flow counted, a connection made). Yields (ctl path, namespace);
    afterwards the run's stderr is checked as a JSON log."""
    if os.geteuid() != 0:
        pytest.skip("the live views need root (a network namespace, AF_PACKET)")
    from netns import DpuOnVeth
    from scapy.all import IP, UDP, Ether

    ctl = str(tmp_path_factory.mktemp("views") / "dpu.ctl")
    with DpuOnVeth(ctl, "--config", NAT_TOPO, "--port", "vm1=dpa", global_args=("--log-format", "json"), ipv6=False,
                   cwd=ROOT) as d:
        frame = bytes(Ether(src=VM1_MAC, dst=GW_MAC) / IP(src="10.0.0.11", dst="198.51.100.1") / UDP(sport=5000, dport=53))

        def connected():  # sent until it is: the socket opens before the workers start
            d.send(frame)
            return ctl_run("ct", "dump", "--ctl", ctl).stdout.strip()
        wait_for(connected, what="the connection to be made")
        yield ctl
    assert d.returncode == 0, d.err
    assert "Ports:" in d.out, d.out  # the final counters: output, on stdout, not a log record
    records = [json.loads(line) for line in d.err.splitlines()]  # every line of stderr is one record
    assert records and all({"time", "level", "logger", "message"} <= r.keys() for r in records), d.err
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", r["time"]) for r in records), d.err
    start = [r for r in records if r["message"].startswith("forwarding on vm1=dpa")]
    assert len(start) == 1 and start[0]["level"] == "info" and start[0]["logger"] == "dpu.live", d.err
    assert start[0]["ports"] == {"vm1": "dpa"} and start[0]["workers"] == 1 and start[0]["ctl"] == ctl, start
    assert any(r["level"] == "warning" and "vm2" in r["message"] for r in records), d.err  # no interface for vm2


def ctl_run(*args):
    r = subprocess.run([sys.executable, "-m", "dpu.cli", *args], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 0, (args, r.stderr)
    return r


def test_live_dump_flows_json(live):
    text = ctl_run("dump-flows", "--ctl", live).stdout.splitlines()
    rows = json.loads(ctl_run("dump-flows", "--ctl", live, "--json").stdout)["flows"]
    same_flows(text, rows)
    assert any(r["n_packets"] >= 1 for r in rows)  # the packets, counted in both
    some = json.loads(ctl_run("dump-flows", "table=0", "--ctl", live, "--json").stdout)["flows"]
    assert 0 < len(some) < len(rows) and {r["table"] for r in some} == {0}


def test_live_dump_groups_json(live):
    text = ctl_run("dump-groups", "--ctl", live).stdout.splitlines()
    rows = json.loads(ctl_run("dump-groups", "--ctl", live, "--json").stdout)["groups"]
    assert [f"{group_text(g)} (n_packets={g['n_packets']}, n_bytes={g['n_bytes']})" for g in rows] == text


def test_live_ct_dump_json(live):
    text = ctl_run("ct", "dump", "--ctl", live).stdout.splitlines()
    rows = json.loads(ctl_run("ct", "dump", "--ctl", live, "--json").stdout)["connections"]
    same_connections(text, rows)
    assert rows[0]["orig"]["dst"] == "198.51.100.1" and rows[0]["snat"]


def test_live_show_json(live):
    text = ctl_run("show", "--ctl", live).stdout.splitlines()
    d = json.loads(ctl_run("show", "--ctl", live, "--json").stdout)
    assert text[0].startswith(f"dpu pid {d['pid']}: {d['workers']} worker(s) on {d['io']}, up ")
    assert f"config {d['config']}" in text[0]
    ports = [f" {p['ofport']}({p['name']}): " + ("tunnel" if p["tunnel"] else (p["interface"] or "(no interface)"))
             for p in d["ports"]]
    assert ports == text[1:1 + len(ports)] and " 3(vm1): dpa" in ports
