"""replace-flows and diff-flows as ovs-ofctl has them (issue 30), offline: the API
(Dataplane.replace_flows: the fewest changes, in one transaction) and `dpu diff-flows`
between files. Against a running dpu: test_live_views.py."""
import os
import subprocess
import sys

import pytest

from dpu import Dataplane
from dpu.errors import UnknownFieldError, UnknownPortError
from helpers.packets import PKT_ARP, PKT_UDP

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOPO = os.path.join(ROOT, "examples", "topology.yaml")

BEFORE = """\
group_id=1,type=all,bucket=actions=output:c,bucket=actions=output:d
group_id=2,type=all,bucket=actions=output:c
table=0,priority=100,in_port=a,udp,actions=output:b
table=0,priority=90,in_port=a,actions=output:c
table=0,priority=80,in_port=a,tcp,actions=group:2
table=1,priority=5,actions=drop
"""
AFTER = """\
# the same first flow spelled another way, one flow modified, one deleted, one added; group 1 changed,
# group 2 deleted, group 3 added
group_id=1,type=all,bucket=actions=output:d
group_id=3,type=all,bucket=actions=output:b
priority=100,udp,in_port=a actions=output:b
table=0,priority=90,in_port=a,cookie=0x7,actions=output:d
table=1,priority=5,actions=drop
table=2,priority=1,in_port=b,actions=group:3
"""


def make_dp():
    dp = Dataplane(ports=["a", "b", "c", "d"])
    dp.add_flows(BEFORE)
    dp.process([PKT_UDP] * 3, in_port="a")  # 3 packets on the udp flow
    return dp


def counts(dp):
    return {(f.table, f.priority, f.match): (f.n_packets, f.cookie, f.actions) for f in dp.dump_flows()}


def test_replace_changes_only_the_difference_in_one_transaction():
    dp = make_dp()
    dp.process(PKT_ARP, in_port="a")  # one on priority 90
    before, v0 = counts(dp), dp.version
    r = dp.replace_flows(AFTER)
    assert dp.version == v0 + 1, "one transaction"
    assert {k: v for k, v in r.items() if k != "version"} == {
        "flows_added": 1, "flows_modified": 1, "flows_deleted": 1, "flows_unchanged": 2,
        "groups_added": 1, "groups_modified": 1, "groups_deleted": 1}
    after = counts(dp)
    udp = (0, 100, "priority=100,udp,in_port=a")
    assert after[udp] == before[udp] and after[udp][0] == 3, "unchanged: its counters kept"
    mod = (0, 90, "priority=90,in_port=a")
    assert after[mod] == (1, 7, "output:d"), "modified in place: new cookie and actions, counters kept"
    assert (0, 80, "priority=80,tcp,in_port=a") not in after
    assert [g.text for g in dp.dump_groups()] == ["group_id=1,type=all,bucket=bucket_id:0,actions=output:d",
                                                  "group_id=3,type=all,bucket=bucket_id:0,actions=output:b"]
    # again: nothing to do, nothing committed
    r = dp.replace_flows(AFTER)
    assert r["flows_unchanged"] == 4 and r["flows_added"] == r["flows_modified"] == r["flows_deleted"] == 0
    assert dp.version == v0 + 1
    # a cookie set back to 0 is a modification too
    r = dp.replace_flows(AFTER.replace(",cookie=0x7", ""))
    assert r["flows_modified"] == 1 and counts(dp)[mod] == (1, 0, "output:d")


def test_unchanged_flows_keep_their_cached_megaflows():
    dp = make_dp()
    upcalls = dp.stats()["workers_total"]["upcalls"]
    dp.replace_flows(AFTER)
    dp.process([PKT_UDP] * 5, in_port="a")
    assert dp.stats()["workers_total"]["upcalls"] == upcalls, "the udp flow's megaflow survived the replace"


def test_a_bad_file_changes_nothing_and_names_its_line(tmp_path):
    dp = make_dp()
    before, v0 = counts(dp), dp.version
    f = tmp_path / "bad.flows"
    f.write_text("table=0,priority=1,actions=drop\ntable=0,in_port=a,actions=output:nowhere\n")
    with pytest.raises(UnknownPortError) as e:
        dp.replace_flows_file(f)
    assert f"{f}:2:" in str(e.value)
    f.write_text("table=0,nw_dsst=1,actions=drop\n")
    with pytest.raises(UnknownFieldError) as e:
        dp.replace_flows_file(f)
    assert f"{f}:1:" in str(e.value)
    assert counts(dp) == before and dp.version == v0


def test_a_topology_reload_after_a_replace_that_dropped_its_groups():
    dp = Dataplane.from_topology(TOPO)
    plain = "\n".join(f.spec for f in dp.dump_flows() if "group:" not in f.actions)
    dp.replace_flows(plain)  # no groups, no flows that use one
    assert dp.dump_groups() == []
    dp.load_topology(TOPO)
    assert len(dp.dump_groups()) == 4 and any("group:" in f.actions for f in dp.dump_flows())


def test_diff_lines_are_ovs_ofctls():
    from dpu import flowdiff

    a, b = make_dp().flow_table(), Dataplane(ports=["a", "b", "c", "d"])
    b.replace_flows(AFTER)
    assert flowdiff.diff_lines(a, b.flow_table()) == [
        "-group_id=1,type=all,bucket=bucket_id:0,actions=output:c,bucket=bucket_id:1,actions=output:d",
        "+group_id=1,type=all,bucket=bucket_id:0,actions=output:d",
        "-group_id=2,type=all,bucket=bucket_id:0,actions=output:c",
        "+group_id=3,type=all,bucket=bucket_id:0,actions=output:b",
        "-table=0,priority=90,in_port=a,actions=output:c",
        "+table=0,priority=90,cookie=0x7,in_port=a,actions=output:d",
        "-table=0,priority=80,tcp,in_port=a,actions=group:2",
        "+table=2,priority=1,in_port=b,actions=group:3",
    ]
    assert flowdiff.diff_lines(a, a) == []


def dpu_cli(*args):
    return subprocess.run([sys.executable, "-m", "dpu.cli", *args], capture_output=True, text=True, timeout=60,
                          cwd=ROOT)


def test_diff_flows_between_files(tmp_path):
    a, b = tmp_path / "a.flows", tmp_path / "b.flows"
    a.write_text(BEFORE)
    b.write_text(AFTER)
    r = dpu_cli("diff-flows", str(a), str(b))
    assert r.returncode == 2, r.stderr  # as ovs-ofctl: differences found
    assert r.stdout.splitlines()[0] == ("-group_id=1,type=all,bucket=bucket_id:0,actions=output:c,"
                                        "bucket=bucket_id:1,actions=output:d")
    assert "+table=2,priority=1,in_port=b,actions=group:3" in r.stdout.splitlines()
    r = dpu_cli("diff-flows", str(a), str(a))
    assert (r.returncode, r.stdout, r.stderr) == (0, "", "")
    # the compiled topology against itself, reformatted by dpu flows --plain: no difference
    compiled, plain = tmp_path / "c.flows", tmp_path / "p.flows"
    compiled.write_text(dpu_cli("compile", TOPO).stdout)
    plain.write_text(dpu_cli("flows", "--config", TOPO, "--plain").stdout)
    r = dpu_cli("diff-flows", str(compiled), str(plain))
    assert (r.returncode, r.stdout) == (0, ""), r.stdout + r.stderr


def test_diff_flows_bad_sources(tmp_path):
    bad = tmp_path / "bad.flows"
    bad.write_text("actions=output:a\nnw_dsst=1,actions=drop\n")
    r = dpu_cli("diff-flows", str(bad), str(bad))
    assert r.returncode == 1 and r.stderr.startswith(f"dpu: UnknownFieldError: {bad}:2:"), r.stderr
    r = dpu_cli("diff-flows", str(tmp_path / "none.flows"), str(bad))
    assert r.returncode == 1 and "no such flows file" in r.stderr, r.stderr
    r = dpu_cli("diff-flows", f"unix:{tmp_path / 'none.ctl'}", str(bad))
    assert r.returncode == 1 and "no dpu is running at" in r.stderr, r.stderr
    r = dpu_cli("replace-flows", str(tmp_path / "none.flows"), "--ctl", str(tmp_path / "none.ctl"))
    assert r.returncode == 1 and "no such flows file" in r.stderr, "the file is read first"
