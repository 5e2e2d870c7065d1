"""Bounded fuzzing (hypothesis, derandomized: the same inputs every run, well
under a minute in all): the flow parser, the pcap reader through ``dpu replay``
and the CLI's path arguments must answer anything with the project's error
(dpu.errors.DpuError, or one "dpu:" line and exit status 1 or 2 from the
command), never a crash, a traceback or another exception.

The longer run: ``DPU_FUZZ_EXAMPLES=20000 python3 -m pytest -q tests/test_fuzz.py``
(that many examples per test, with fresh random inputs each run).
"""
import contextlib
import io
import os
import struct
from pathlib import Path

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import dpu  # noqa: E402
from dpu.cli import main  # noqa: E402
from dpu.errors import DpuError  # noqa: E402
from helpers.fuzzing import bounded, edited  # noqa: E402


# ---- the flow parser --------------------------------------------------------------------

VALID = [
    "table=0,priority=100,in_port=vm1,ip,nw_dst=10.0.0.0/24,actions=mod_dl_dst:02:00:00:00:00:02,goto_table:1",
    "table=1,ip,actions=dec_ttl,output:vm2",
    "priority=5,tcp,tp_dst=80,tcp_flags=+syn-ack,actions=ct(commit,zone=5,nat(src=10.0.0.1-10.0.0.9:100-200)),vm3",
    "in_port=vm2,dl_vlan=10,actions=strip_vlan,push_vlan:0x8100,mod_vlan_vid:20,resubmit(,3)",
    "ipv6,ipv6_src=2001:db8::/32,actions=set_field:2001:db8::1->ipv6_dst,output:vm1",
    "arp,arp_op=1,actions=move:NXM_OF_ETH_SRC[]->NXM_OF_ETH_DST[],load:0x1->NXM_NX_REG0[0..3],flood",
    "cookie=0x5/0xff,metadata=0x1/0xff,reg3=7,actions=write_metadata:0x2/0xff,note:aa.bb,group:1",
    "group_id=1,type=select,bucket=weight:2,actions=output:vm2,bucket=weight:1,actions=output:vm3",
]
TOKENS = ["table=", "priority=", "in_port=", "actions=", "output:", "vm1", "vm2", ",", " ", "=", ":", "/", "(",
          ")", "[", "]", "..", "->", "0x", "ff", "10.0.0.1", "2001:db8::", "ip", "tcp", "nw_src", "tp_dst",
          "ct(", "commit", "nat(", "src=", "zone=", "load:", "move:", "NXM_NX_REG0", "set_field:", "group:",
          "resubmit", "dl_vlan", "-", "+", "4294967296", "18446744073709551616", "-1", "\x00", "\n", "#",
          "é", "\u2028", "group_id=", "bucket=", "weight:", "type=select"]


@st.composite
def flow_text(draw):
    kind = draw(st.integers(0, 2))
    if kind == 0:  # a valid flow, changed a little
        return edited(draw, draw(st.sampled_from(VALID)), TOKENS)
    if kind == 1:  # flow-shaped token soup
        return "".join(draw(st.lists(st.sampled_from(TOKENS), max_size=30)))
    return draw(st.text(max_size=120))


@pytest.fixture(scope="module")
def dp():
    return dpu.Dataplane(ports=["vm1", "vm2", "vm3"])


@bounded(300)
@given(text=flow_text())
def test_flow_parser_answers_with_dpu_errors(dp, text):
    try:
        dp.add_flows(text)
    except DpuError:
        pass
    try:
        if text.startswith("group_id="):
            dp.add_group(text)
        else:
            dp.del_flows(text.split("actions=")[0].rstrip(","))
    except DpuError:
        pass


# ---- the pcap reader, through dpu replay ---------------------------------------------------


def _pcaps():
    """A classic pcap and a pcapng of three frames, as bytes."""
    import tempfile

    from scapy.all import IP, UDP, Ether, PcapNgWriter, wrpcap

    pkts = [Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02") / IP(src="10.0.0.1", dst="10.0.0.2") /
            UDP(sport=i, dport=53) for i in range(1, 4)]
    with tempfile.TemporaryDirectory() as d:
        wrpcap(os.path.join(d, "a.pcap"), pkts)
        w = PcapNgWriter(os.path.join(d, "b.pcapng"))
        for p in pkts:
            w.write(p)
        w.close()
        return [Path(d, "a.pcap").read_bytes(), Path(d, "b.pcapng").read_bytes()]


BASES = None


@st.composite
def pcap_bytes(draw):
    global BASES
    if BASES is None:
        BASES = _pcaps()
    kind = draw(st.integers(0, 3))
    if kind == 3:
        return draw(st.binary(max_size=200))
    data = bytearray(draw(st.sampled_from(BASES)))
    if kind in (0, 2):  # cut
        data = data[:draw(st.integers(0, len(data)))]
    if kind in (1, 2):  # flip bytes, or write odd numbers into the headers' fields
        for _ in range(draw(st.integers(1, 6))):
            if not data:
                break
            i = draw(st.integers(0, len(data) - 1))
            if draw(st.booleans()) and i + 4 <= len(data):
                data[i:i + 4] = struct.pack("<I", draw(st.sampled_from([0, 1, 0xffff, 0x7fffffff, 0xffffffff,
                                                                           65536, 262145])))
            else:
                data[i] = draw(st.integers(0, 255))
    return bytes(data)


def run_cli(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main([str(a) for a in argv])
        except SystemExit as e:
            rc = e.code
    return rc, out.getvalue(), err.getvalue()


def check_answer(rc, err):
    assert rc in (0, 1, 2), (rc, err)
    assert "Traceback" not in err and "internal error" not in err, err
    if rc:
        lines = err.rstrip().splitlines()
        first = next(i for i, line in enumerate(lines) if line.startswith("dpu:"))
        # one line, or a topology's several mistakes: one line each after the first
        assert first == len(lines) - 1 or lines[first].startswith("dpu: TopologyError"), err


@pytest.fixture(scope="module")
def replay_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("fuzz-replay")
    (d / "fwd.txt").write_text("table=0,in_port=vm1,actions=output:vm2\n")
    return d


@bounded(120)
@given(data=pcap_bytes())
def test_pcap_reader_through_replay(replay_dir, data):
    (replay_dir / "in.pcap").write_bytes(data)
    rc, out, err = run_cli(["replay", "--flows", replay_dir / "fwd.txt", "--in", f"vm1={replay_dir / 'in.pcap'}",
                            "--out-dir", replay_dir / "out", "--no-progress"])
    check_answer(rc, err)
    if rc == 1:
        assert "in.pcap" in err  # the error names the capture


def test_a_few_bad_pcaps_in_a_child_process(replay_dir):
    """The same through the real entry point: a crash would show as a signal."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    for i, data in enumerate([b"", b"\xd4\xc3\xb2\xa1" + b"\x00" * 20, _pcaps()[0][:-5], _pcaps()[1][:50]]):
        f = replay_dir / f"c{i}.pcap"
        f.write_bytes(data)
        r = subprocess.run([sys.executable, "-m", "dpu.cli", "replay", "--flows", str(replay_dir / "fwd.txt"),
                            "--in", f"vm1={f}", "--out-dir", str(replay_dir / "cout")], capture_output=True,
                           text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(root)})
        check_answer(r.returncode, r.stderr)


# ---- the CLI's path arguments -----------------------------------------------------------------


@pytest.fixture(scope="module")
def paths_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("fuzz-paths")
    (d / "f").write_text("table=0,actions=drop\n")
    (d / "dir").mkdir()
    (d / "full").symlink_to("/dev/full")
    (d / "dangling").symlink_to(d / "nowhere")
    (d / "bin").write_bytes(b"\xff\xfe\x00\x01")
    return d


NAMES = ["f", "dir", "full", "dangling", "bin", "dir/", "f/x", "missing", "a:b.yaml", "vm1=x", " ", "-",
         "x\ny", "é", "dir/../f", "\x00", "~", "*", "%s", "a" * 300]


@st.composite
def path_arg(draw):
    # no "/" inside a random part and no ".." part: every path stays inside the test's directory
    part = st.text(alphabet=st.characters(exclude_categories=["Cs"], exclude_characters="/"), min_size=1,
                   max_size=12).filter(lambda s: s not in (".", ".."))
    return "/".join(draw(st.lists(st.sampled_from(NAMES) | part, min_size=1, max_size=3)))


@bounded(200)
@given(path=path_arg(), which=st.integers(0, 8))
def test_path_arguments(paths_dir, path, which):
    p = str(paths_dir / path)
    f, pc = paths_dir / "f", paths_dir / "missing.pcap"
    argv = [
        ["flows", p],
        ["compile", p],
        ["replay", "--flows", p, "--in", f"vm1={pc}", "--out-dir", paths_dir / "out"],
        ["replay", "--flows", f, "--in", f"vm1={p}", "--out-dir", paths_dir / "out"],
        ["replay", "--flows", f, "--in", f"vm1={paths_dir / 'bin'}", "--out-dir", p],
        ["trace", "--config", p, "--in-port", "vm1", "--hex", "00" * 14],
        ["gen", "Ether()/IP()/UDP()", "-n", "2", "-o", p],
        ["ct", "dump", "--flows", f, "--in", f"vm1={p}"],
        ["flows", "--flows", f, "--config", p],
    ][which]
    rc, out, err = run_cli(argv)
    check_answer(rc, err)
