"""What dpu prints reads back as what it was given (issue: round trips and surprises).

dump-flows output (dpu's and ovs-ofctl's, statistics and reply header included),
`dpu flows` of a topology (groups first) and `dpu compile` are flows files; numeric
ports are OpenFlow port numbers, listed by `dpu show`, and a number that names no
port is an error.
"""
import json
import os
import re

import pytest

from dpu.cli import main
from dpu.dataplane import Dataplane
from dpu.errors import UnknownPortError

TOPO = os.path.join(os.path.dirname(__file__), "..", "examples", "topology.yaml")

# What `ovs-ofctl -O OpenFlow13 dump-flows br0` prints (OVS 3.1), as a user saves it.
OVS_DUMP = """OFPST_FLOW reply (OF1.3) (xid=0x2):
 cookie=0x5, duration=12.345s, table=0, n_packets=3, n_bytes=180, idle_age=4, hard_age=4, priority=10,ip,in_port=1,nw_dst=10.0.0.0/24 actions=dec_ttl,output:2
 cookie=0x0, duration=0.5s, table=1, n_packets=0, n_bytes=0, priority=0 actions=drop
"""


def _flows(capsys, *argv):
    assert main(["flows", *argv]) == 0
    out, err = capsys.readouterr()
    return [re.sub(r"duration=[0-9.]+s", "duration=X", line) for line in out.splitlines()], err


def test_ovs_dump_flows_output_is_a_flows_file(tmp_path, capsys):
    f = tmp_path / "dump.txt"
    f.write_text(OVS_DUMP)
    lines, _ = _flows(capsys, "--flows", str(f), "--ports", "vm1,vm2")
    assert lines == [
        "cookie=0x5, duration=X, table=0, n_packets=0, n_bytes=0, priority=10,ip,in_port=vm1,nw_dst=10.0.0.0/24 "
        "actions=dec_ttl,output:vm2",
        "cookie=0x0, duration=X, table=1, n_packets=0, n_bytes=0, priority=0 actions=drop",
    ]


def test_statistics_keywords_are_ignored_by_the_api():
    dp = Dataplane(ports=["a", "b"])
    dp.add_flow("duration=1.000s, n_packets=7, n_bytes=9, idle_age=1, hard_age=2, priority=3,in_port=a actions=output:b")
    (f,) = dp.dump_flows()
    assert "priority=3,in_port=a" in f and f.n_packets == 0


def test_topology_listing_reads_back_whole(tmp_path, capsys):
    first, _ = _flows(capsys, "--config", TOPO)
    assert first[0].startswith("group_id=1,type=all,") and not any("n_packets" in x for x in first if
                                                                    x.startswith("group_id="))
    saved = tmp_path / "compiled.txt"
    saved.write_text("\n".join(first) + "\n")
    again, err = _flows(capsys, "--flows", str(saved))
    assert sorted(again) == sorted(first)
    assert "warning" in err and "'vxlan0'" in err and "--config" in err


def test_compile_output_loads_as_flows(tmp_path, capsys):
    assert main(["compile", TOPO]) == 0
    text = capsys.readouterr().out
    f = tmp_path / "c.txt"
    f.write_text(text)
    dp = Dataplane()
    n = dp.load_flows(str(f), create_ports=True)
    n_groups = sum(1 for line in text.splitlines() if line.startswith("group_id="))
    assert n == sum(1 for line in text.splitlines() if line.startswith("table=")) and n > 20
    assert len(dp.dump_groups()) == n_groups > 0


def test_numeric_ports_are_openflow_numbers(tmp_path, capsys):
    f = tmp_path / "f.txt"
    f.write_text("in_port=7,actions=output:3\n")
    lines, _ = _flows(capsys, "--flows", str(f), "--ports", "vm2=7,vm1=3")
    assert lines == ["cookie=0x0, duration=X, table=0, n_packets=0, n_bytes=0, in_port=vm2 actions=output:vm1"]
    assert main(["show", "--ports", "vm2=7,vm1=3"]) == 0
    assert capsys.readouterr().out.splitlines() == [" 3(vm1)", " 7(vm2)"]


@pytest.mark.parametrize("flow", ["in_port=9,actions=output:3", "in_port=3,actions=output:9"])
def test_a_number_that_names_no_port_is_an_error(flow):
    dp = Dataplane()
    dp.add_port("vm1", 3)
    with pytest.raises(UnknownPortError, match=r"unknown port 9 \(no port has that number\)"):
        dp.add_flow(flow)


def test_show_lists_a_topology_s_ports(capsys):
    assert main(["show", "--config", TOPO, "--json"]) == 0
    ports = json.loads(capsys.readouterr().out)["ports"]
    by_name = {p["name"]: p for p in ports}
    assert by_name["vxlan0"]["tunnel"] and not by_name["vm1"]["tunnel"]
    assert sorted(p["ofport"] for p in ports) == list(range(1, len(ports) + 1))


def test_bad_port_number_in_ports_option(capsys):
    with pytest.raises(SystemExit):
        main(["show", "--ports", "a=0"])
    assert "OpenFlow port number must be 1..65279" in capsys.readouterr().err
