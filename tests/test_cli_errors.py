"""The dpu command's errors and help (issue 9, "Errors and help"): every
failure ends in one "dpu:" line naming the file, line, column or record, and a
non-zero exit, never a Python traceback; nothing the user gave is destroyed;
every path argument is a path; numbers are checked; --help shows choices and
defaults. Run as the user runs it: ``python3 -m dpu.cli`` in a child process."""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dpu import errors

ROOT = Path(__file__).resolve().parent.parent
TOPO = ROOT / "examples" / "topology.yaml"
FWD = "table=0,in_port=vm1,actions=output:vm2\n"


def dpu(*args, cwd=None, timeout=300, prefix=()):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("DPU_TRACEBACK", None)
    return subprocess.run([*prefix, sys.executable, "-m", "dpu.cli", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout, env=env)


def one_error(r, *needles, code=None) -> str:
    """The one "dpu:" line of a failed run; no traceback; the exit status."""
    assert "Traceback" not in r.stderr, r.stderr
    lines = [line for line in r.stderr.splitlines() if line.startswith("dpu:")]
    assert len(lines) == 1, r.stderr
    assert r.stderr.rstrip().splitlines()[-1] == lines[0], r.stderr  # it ends the output
    assert r.returncode != 0
    if code is not None:
        assert r.returncode == code, (r.returncode, r.stderr)
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


def pcap(path: Path, n: int = 3, size: int = 60) -> Path:
    from dpu import gen

    gen.generate_pcap(str(path), 'Ether(src="02:00:00:00:00:01",dst="02:00:00:00:00:02")/IP()/UDP()', n, size=size)
    return path


@pytest.fixture
def work(tmp_path):
    (tmp_path / "fwd.txt").write_text(FWD)
    pcap(tmp_path / "a.pcap")
    return tmp_path


def unshare_ok(*flags) -> bool:
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return False
    return subprocess.run(["unshare", *flags, "true"], capture_output=True).returncode == 0


# ---- no traceback: missing, unreadable and odd files -------------------------------------


def test_missing_flows_file(work):
    one_error(dpu("flows", "missing.txt", cwd=work), "missing.txt", "No such file or directory", code=1)
    one_error(dpu("replay", "--flows", "missing.txt", "--in", "vm1=a.pcap", "--out-dir", "out", cwd=work),
              "missing.txt", "No such file or directory")
    assert not (work / "out").exists()


def test_flows_file_not_utf8_names_line_and_column(work):
    (work / "latin1.txt").write_bytes(b"table=0,actions=drop\n# caf\xe9\n")
    line = one_error(dpu("flows", "latin1.txt", cwd=work), code=1)
    assert "latin1.txt:2: column 6" in line and "0xe9" in line and "UTF-8" in line


def test_flows_file_with_utf8_bom_is_accepted(work):
    (work / "bom.txt").write_bytes(b"\xef\xbb\xbftable=0,priority=7,actions=drop\n")
    r = dpu("flows", "--plain", "bom.txt", cwd=work)
    assert r.returncode == 0, r.stderr
    assert "priority=7" in r.stdout


def test_directory_given_as_a_file(work):
    (work / "d").mkdir()
    one_error(dpu("flows", "d", cwd=work), "d", "Is a directory", code=1)
    one_error(dpu("replay", "--flows", "fwd.txt", "--in", "vm1=d", "--out-dir", "out", cwd=work),
              "d", "is a directory", code=1)
    one_error(dpu("compile", "d", cwd=work), "d", "directory", code=1)
    one_error(dpu("gen", "Ether()/IP()/UDP()", "-n", "1", "-o", "d", cwd=work), "d", "is a directory", code=1)


def test_missing_capture_and_topology(work):
    one_error(dpu("replay", "--flows", "fwd.txt", "--in", "vm1=nope.pcap", "--out-dir", "out", cwd=work),
              "nope.pcap", code=1)
    one_error(dpu("compile", "missing:file.yaml", cwd=work), "missing:file.yaml", code=1)
    line = one_error(dpu("trace", "--config", "missing:file.yaml", "--in-port", "vm1", "--hex", "00" * 14, cwd=work))
    assert "missing:file.yaml" in line and "no such" in line.lower()


def test_out_dir_that_is_a_file(work):
    before = (work / "fwd.txt").read_bytes()
    one_error(dpu("replay", "--flows", "fwd.txt", "--in", "vm1=a.pcap", "--out-dir", "fwd.txt", cwd=work),
              "fwd.txt", "not a directory", code=1)
    assert (work / "fwd.txt").read_bytes() == before
    one_error(dpu("demo", "--packets", "1", "--out-dir", "fwd.txt", cwd=work), "fwd.txt", "not a directory", code=1)


def test_out_dir_in_a_read_only_place(work):
    if os.geteuid() == 0:
        if not unshare_ok("-m"):
            pytest.skip("needs unshare -m for a read-only mount")
        ro = work / "ro"
        ro.mkdir()
        script = (f"mount -t tmpfs -o ro tmpfs {ro} && exec {sys.executable} -m dpu.cli replay --flows fwd.txt "
                  f"--in vm1=a.pcap --out-dir {ro}/out")
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        r = subprocess.run(["unshare", "-m", "sh", "-c", script], cwd=work, capture_output=True, text=True,
                           timeout=120, env=env)
        one_error(r, f"{ro}/out", "Read-only file system", code=1)
    else:
        ro = work / "ro"
        ro.mkdir(mode=0o555)
        one_error(dpu("replay", "--flows", "fwd.txt", "--in", "vm1=a.pcap", "--out-dir", ro / "out", cwd=work),
                  "ro/out", "Permission denied", code=1)


def test_internal_error_is_one_line(monkeypatch, capsys, work):
    from dpu import cli

    def boom(args):
        raise RuntimeError("something unforeseen")

    monkeypatch.setattr(cli, "cmd_compile", boom)
    monkeypatch.delenv("DPU_TRACEBACK", raising=False)
    assert cli.main(["compile", str(TOPO)]) == 70
    err = capsys.readouterr().err
    assert err.count("dpu:") == 1 and "internal error: RuntimeError: something unforeseen" in err


@pytest.mark.parametrize("core", ["v9", "x86-64-v3"])
def test_a_core_that_cannot_load_is_one_line(core):
    """DPU_CORE naming no build: the command says so in its one line, as it says every error."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DPU_CORE": core}
    env.pop("DPU_TRACEBACK", None)
    r = subprocess.run([sys.executable, "-m", "dpu", "--version"], capture_output=True, text=True, timeout=60,
                       env=env)
    line = one_error(r, f"DPU_CORE={core}: takes one of v3, v1", code=1)
    assert r.stderr == line + "\n" and r.stdout == "", r.stderr


def test_python_m_dpu_is_the_command():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("DPU_CORE", None)
    r = subprocess.run([sys.executable, "-m", "dpu", "--version"], capture_output=True, text=True, timeout=60,
                       env=env)
    assert r.returncode == 0 and r.stdout.startswith("dpu "), r.stdout + r.stderr


def test_nul_in_a_path(capsys, work):
    from dpu.cli import main

    assert main(["flows", "a\x00b"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("dpu: ") and "Traceback" not in err and err.count("\n") == 1


# ---- numbers are checked ---------------------------------------------------------------


@pytest.mark.parametrize("argv,needle", [
    (["demo", "--packets", "0"], "--packets: must be positive, got 0"),
    (["demo", "--packets", "-5"], "--packets: must be positive, got -5"),
    (["bench", "--repeat", "0", "l3-rewrite-1k"], "--repeat: must be positive, got 0"),
    (["bench", "--packets", "0"], "--packets: must be positive, got 0"),
    (["bench", "--burst", "0", "l3-rewrite-1k"], "--burst: must be 1..256, got 0"),
    (["bench", "--burst", "257", "l3-rewrite-1k"], "--burst: must be 1..256, got 257"),
    (["gen", "Ether()/IP()/UDP()", "-n", "0", "-o", "x.pcap"], "--count: must be positive"),
    (["gen", "Ether()/IP()/UDP()", "--flows", "0", "-o", "x.pcap"], "--flows: must be positive"),
    (["gen", "Ether()/IP()/UDP()", "--size", "300000", "-o", "x.pcap"], "--size: must be 14..262144"),
    (["run", "--port", "a=lo", "--workers", "0"], "--workers: must be 1..64"),
    (["run", "--port", "a=lo", "--burst", "1000"], "--burst: must be 1..256"),
    (["demo", "--packets", "many"], "'many' is not a whole number"),
])
def test_numbers_are_checked(work, argv, needle):
    one_error(dpu(*argv, cwd=work, timeout=60), needle, code=2)
    assert not (work / "dpu-demo").exists() and not (work / "x.pcap").exists()


# ---- nothing the user gave is destroyed ------------------------------------------------------


def test_output_that_is_the_flows_file_is_refused(work):
    out = work / "out"
    out.mkdir()
    (out / "vm2.pcap").write_text(FWD)  # the flows file lives where vm2's output would go
    r = dpu("replay", "--flows", out / "vm2.pcap", "--in", "vm1=a.pcap", "--out-dir", out, cwd=work)
    one_error(r, "vm2.pcap", "flows file", code=1)
    assert (out / "vm2.pcap").read_text() == FWD
    assert sorted(p.name for p in out.iterdir()) == ["vm2.pcap"]  # nothing else written either


def test_output_that_is_the_topology_is_refused(work):
    out = work / "out"
    out.mkdir()
    shutil.copy(TOPO, out / "vm1.pcap")
    before = (out / "vm1.pcap").read_bytes()
    r = dpu("replay", "--config", out / "vm1.pcap", "--in", f"p0={work / 'a.pcap'}", "--out-dir", out, cwd=work)
    one_error(r, "vm1.pcap", "topology file", code=1)
    assert (out / "vm1.pcap").read_bytes() == before


def test_the_65th_of_65_captures_is_never_overwritten(work):
    out = work / "out"
    out.mkdir()
    ins = [pcap(work / f"in{i}.pcap", n=1) for i in range(1, 65)]
    last = pcap(out / "p65.pcap", n=2)  # the 65th input is where port p65's output goes
    before = last.read_bytes()
    flows = work / "p.txt"
    flows.write_text("table=0,actions=drop\n")
    args = ["replay", "--flows", flows, "--out-dir", out]
    for i, p in enumerate(ins + [last], 1):
        args += ["--in", f"p{i}={p}"]
    one_error(dpu(*args, cwd=work), "p65.pcap", "capture file", code=1)
    assert last.read_bytes() == before
    assert sorted(p.name for p in out.iterdir()) == ["p65.pcap"]


def test_the_api_refuses_the_65th_capture_too(work):
    """The native replayer compares every input, not the first 64."""
    from dpu import Dataplane

    out = work / "out"
    out.mkdir()
    ins = [pcap(work / f"in{i}.pcap", n=1) for i in range(1, 65)]
    last = pcap(out / "p65.pcap", n=2)
    before = last.read_bytes()
    dp = Dataplane(ports=[f"p{i}" for i in range(1, 66)], flows=["actions=drop"])
    with pytest.raises(errors.DpuError, match="destroy"):
        dp.replay([(f"p{i}", str(p)) for i, p in enumerate(ins + [last], 1)], str(out))
    assert last.read_bytes() == before


def test_write_that_fails_names_the_file_and_reason_and_prints_the_summary(work):
    out = work / "out"
    out.mkdir()
    (out / "vm2.pcap").symlink_to("/dev/full")
    r = dpu("replay", "--flows", "fwd.txt", "--in", "vm1=a.pcap", "--out-dir", out, cwd=work)
    one_error(r, "vm2.pcap", "No space left on device", code=1)
    assert "packets in 3, out 3" in r.stdout
    assert os.path.islink(out / "vm2.pcap")  # a device is not "cleaned up"
    r = dpu("gen", "Ether()/IP()/UDP()", "-n", "10", "-o", "/dev/full", cwd=work)
    one_error(r, "/dev/full", "No space left on device", code=1)


def test_output_through_a_symbolic_link_keeps_the_link(work):
    """-o through a link writes the file it points to (as the shell's > does);
    the link stays a link."""
    (work / "target.pcap").write_text("old")
    os.symlink("target.pcap", work / "link.pcap")
    r = dpu("gen", "Ether()/IP()/UDP()", "-n", "3", "-o", "link.pcap", cwd=work)
    assert r.returncode == 0, r.stderr
    assert os.readlink(work / "link.pcap") == "target.pcap"
    from dpu import gen

    assert len(gen.read_pcap(str(work / "target.pcap"))) == 3


def test_output_through_a_link_to_dev_stdout_writes_the_stream(work):
    """A link whose target names a descriptor is written as that stream, not
    resolved into /proc/PID/fd/pipe:[N], which cannot be opened."""
    os.symlink("/dev/stdout", work / "out.pcap")
    r = subprocess.run(f"{sys.executable} -m dpu.cli gen 'Ether()/IP()/UDP()' -n 3 -o out.pcap | cat > got.pcap",
                       shell=True, cwd=work, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0 and "wrote 3 packets to out.pcap" in r.stderr, r.stderr
    assert os.readlink(work / "out.pcap") == "/dev/stdout"
    from dpu import gen

    assert len(gen.read_pcap(str(work / "got.pcap"))) == 3


def test_output_to_dev_stdout_writes_the_stream(work):
    """-o /dev/stdout (a link to /proc/self/fd/1) writes the capture into the
    redirected stdout, the summary to stderr, and leaves /dev/stdout a link.
    Run with a private /dev so that a regression cannot replace the machine's."""
    if not unshare_ok("-m"):
        pytest.skip("needs root and unshare -m for a private /dev")
    script = ("mount -t tmpfs tmpfs /dev && ln -s /proc/self/fd/1 /dev/stdout && "
              f"{sys.executable} -m dpu.cli gen 'Ether()/IP()/UDP()' -n 3 -o /dev/stdout > out.pcap; "
              "echo rc=$? >&2; ls -l /dev/stdout >&2")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run(["unshare", "-m", "sh", "-c", script], cwd=work, capture_output=True, text=True,
                       timeout=120, env=env)
    assert "rc=0" in r.stderr and "wrote 3 packets to /dev/stdout" in r.stderr, r.stderr
    assert "-> /proc/self/fd/1" in r.stderr, r.stderr
    from dpu import gen

    assert len(gen.read_pcap(str(work / "out.pcap"))) == 3


def test_disk_full_leaves_no_truncated_file(work):
    if not unshare_ok("-m"):
        pytest.skip("needs root and unshare -m for a small private tmpfs")
    pcap(work / "big.pcap", n=4000, size=200)  # ~860 kB in, twice that out
    (work / "fan.txt").write_text("table=0,in_port=vm1,actions=output:vm2,output:vm3\n")
    small = work / "small"
    small.mkdir()
    script = (f"mount -t tmpfs -o size=1200k tmpfs {small} && "
              f"{sys.executable} -m dpu.cli replay --flows fan.txt --in vm1=big.pcap --out-dir {small}/out; rc=$?; "
              f"echo ==; wc -c {small}/out/*; "
              f"{sys.executable} -m dpu.cli gen 'Ether()/IP()/UDP()' -n 100000 --size 100 -o {small}/g.pcap; "
              f"echo rc=$rc; ls -1a {small}")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run(["unshare", "-m", "sh", "-c", script], cwd=work, capture_output=True, text=True,
                       timeout=300, env=env)
    assert "Traceback" not in r.stderr
    errs = [line for line in r.stderr.splitlines() if line.startswith("dpu:")]
    assert len(errs) == 2, r.stderr
    failed = re.search(r"(\S+\.pcap): write failed: No space left on device", errs[0]).group(1)
    assert failed.startswith(f"{small}/out/")
    assert "g.pcap" in errs[1] and "No space left on device" in errs[1]
    summary, rest = r.stdout.split("==", 1)
    assert "packets in 4000, out 8000" in summary  # the summary is still printed
    assert f"removed {failed}: incomplete" in summary
    assert "rc=1" in rest
    sizes = {os.path.basename(f): int(n) for n, f in re.findall(r"^\s*(\d+) (\S+\.pcap)$", rest, re.M)}
    assert os.path.basename(failed) not in sizes
    for name, size in sizes.items():  # what stays is whole: the header and 4000 records of 16 + 200 bytes
        assert size == {"vm1.pcap": 24}.get(name, 24 + 4000 * 216), (name, size)
    after = rest.split("rc=1")[1].split()
    assert "g.pcap" not in after and not [n for n in after if n.endswith(".tmp")]  # gen left nothing


def test_gen_replaces_an_existing_output_only_when_complete(work):
    (work / "g.pcap").write_bytes(b"old")
    r = dpu("gen", "Ether()/IP()/UDP()", "-n", "5", "-o", "g.pcap", cwd=work)
    assert r.returncode == 0, r.stderr
    from dpu import gen

    assert len(gen.read_pcap(str(work / "g.pcap"))) == 5
    assert [p.name for p in work.iterdir() if p.name.startswith(".")] == []
    r = dpu("gen", "Ether()/Bogus()", "-n", "5", "-o", "g.pcap", cwd=work)
    one_error(r, "Bogus")
    assert len(gen.read_pcap(str(work / "g.pcap"))) == 5  # the failed run did not truncate it
    assert [p.name for p in work.iterdir() if p.name.startswith(".")] == []


# ---- every path argument is a path; --hex -------------------------------------------------


def test_hex_empty_and_bad(work):
    base = ["trace", "--flows", "fwd.txt", "--in-port", "vm1"]
    one_error(dpu(*base, "--hex", "", cwd=work), "--hex", "empty", code=1)
    one_error(dpu(*base, "--hex", "0z", cwd=work), "--hex", "'z'", code=1)
    one_error(dpu(*base, "--hex", "abc", cwd=work), "--hex", "3 hex digits", code=1)
    r = dpu(*base, "--hex", "02:00:00:00:00:02 02:00:00:00:00:01 0800", cwd=work)
    assert r.returncode == 0 and "Output: vm2" in r.stdout, r.stderr


# ---- help, version, --vary names ----------------------------------------------------------


def test_version():
    from dpu import __version__

    r = dpu("--version")
    assert r.returncode == 0 and r.stdout.startswith(f"dpu {__version__}, core x86-64"), r.stdout
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'^version = "([^"]+)"', pyproject, re.M).group(1) == __version__


def test_help_lists_scenarios_and_defaults():
    from dpu.bench import SCENARIOS

    r = dpu("bench", "--help")
    text = " ".join(r.stdout.split()).replace("- ", "-")
    assert all(name in text for name in SCENARIOS) and "live-l3" in text
    assert "(default: 5)" in text
    r = dpu("gen", "--help")
    text = " ".join(r.stdout.split())
    assert "(default: 1000)" in text and "nw_dst" in text and "tp_src" in text


def test_every_option_with_a_default_shows_it():
    import argparse

    from dpu.cli import _parser

    p = _parser()
    subs = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
    for name, sp in subs.choices.items():
        text = " ".join(sp.format_help().split()).replace("- ", "-")  # argparse wraps after a hyphen
        for a in sp._actions:
            d = a.default
            if not a.option_strings or a.required or d in (None, False, [], argparse.SUPPRESS) or a.help is None:
                continue
            assert "default" in a.help.lower() or f"(default: {d})" in text, (name, a.option_strings)


def test_vary_takes_the_flow_syntax_names(work):
    r = dpu("gen", 'Ether()/IP(dst="10.0.0.1")/UDP()', "-n", "8", "--flows", "8", "--vary", "nw_dst=10.0.0.0/29",
            "--vary", "tp_src=1000", "-o", "v.pcap", cwd=work)
    assert r.returncode == 0, r.stderr
    from scapy.all import IP, UDP, rdpcap

    pkts = rdpcap(str(work / "v.pcap"))
    assert sorted(p[IP].dst for p in pkts) == [f"10.0.0.{i}" for i in range(8)]
    assert {p[UDP].sport for p in pkts} == {1000}
    r = dpu("gen", "Ether()/IP()/UDP()", "-n", "2", "--vary", "ip.src=10.0.0.0/31", "-o", "w.pcap", cwd=work)
    assert r.returncode == 0, r.stderr  # the old names still work


# ---- offline and deterministic: the one scapy evaluator ------------------------------------------


DEFAULTS = "dl_src=00:00:00:00:00:00,dl_dst=ff:ff:ff:ff:ff:ff,nw_src=0.0.0.0,nw_dst=10.0.0.5"


def test_trace_fills_unset_fields_with_the_documented_defaults(work):
    r = dpu("trace", "--flows", "fwd.txt", "--in-port", "vm1", 'Ether()/IP(dst="10.0.0.5")/UDP()', cwd=work)
    assert r.returncode == 0, r.stderr
    assert DEFAULTS in r.stdout.splitlines()[0]


def test_gen_fills_unset_fields_with_the_documented_defaults(work):
    from dpu import gen
    from dpu.packet_expr import DEFAULTS as D

    pk = gen.generate('Ether()/IP(dst="10.0.0.5")/UDP()/ARP()', 1)
    frame = pk[0]
    assert frame[:6] == bytes.fromhex("ffffffffffff") and frame[6:12] == bytes(6)
    assert frame[26:30] == bytes(4)  # nw_src 0.0.0.0
    assert D == {"dst_mac": "ff:ff:ff:ff:ff:ff", "src_mac": "00:00:00:00:00:00", "src_ip": "0.0.0.0",
                 "src_ip6": "::"}


@pytest.mark.parametrize("expr", [
    'Ether()/IP(dst="10.0.0.5")/UDP()',
    'Ether()/IPv6(dst="2001:db8::5")/UDP()',
    'Ether()/ARP(pdst="10.0.0.1")',
    'Ether()/IP(dst="192.0.2.1")/UDP(dport=4789)/VXLAN(flags=8)/Ether()/IP(dst="10.0.0.5")/TCP()',
    'Ether()/Dot1Q(vlan=5)/IP()/ICMP()',
])
def test_evaluator_never_asks_the_host(monkeypatch, expr):
    """No route lookup, no interface address, no ARP or neighbour solicitation."""
    from scapy.config import conf
    import scapy.layers.l2 as l2

    from dpu import packet_expr

    def host(*a, **k):
        raise AssertionError("looked at the host's network")

    monkeypatch.setattr(conf.route, "route", host)
    monkeypatch.setattr(conf.route6, "route", host)
    monkeypatch.setattr(conf.neighbor, "resolve", host)
    monkeypatch.setattr(l2, "getmacbyip", host)
    data = packet_expr.build(expr)
    assert data[:12] == bytes.fromhex("ffffffffffff") + bytes(6)


def test_trace_is_the_same_without_a_network(work):
    if not unshare_ok("-n"):
        pytest.skip("needs root and unshare -n (a network namespace without interfaces)")
    args = ("trace", "--flows", "fwd.txt", "--in-port", "vm1", "--json", 'Ether()/IP(dst="10.0.0.5")/UDP()')
    here = dpu(*args, cwd=work)
    alone = dpu(*args, cwd=work, prefix=("unshare", "-n"))
    assert here.returncode == alone.returncode == 0, here.stderr + alone.stderr
    strip = lambda s: re.sub(r'"duration[^,]*,', "", s)  # noqa: E731
    assert strip(here.stdout) == strip(alone.stdout)


def test_one_evaluator():
    """dpu trace and dpu gen evaluate expressions through dpu.packet_expr only."""
    for name in ("cli.py", "gen.py"):
        src = (ROOT / "dpu" / name).read_text()
        assert not re.search(r"\beval\(", src), name
    from dpu import gen, packet_expr

    assert bytes(gen._template_packet('Ether()/IP()/UDP()')[0]) == packet_expr.build('Ether()/IP()/UDP()')


# ---- one mapping from native errors to exceptions ----------------------------------------------


def test_one_native_error_mapping():
    # the codes are listed once, in errors.def (status.h makes dpu::Err from it)
    errors_def = (ROOT / "native" / "include" / "dpu" / "errors.def").read_text()
    codes = [c for c in re.findall(r"^DPU_ERR\(([A-Z_]+),", errors_def, re.M) if c != "OK"]
    assert codes and set(codes) == set(errors.NATIVE_ERRORS)
    module_cc = (ROOT / "native" / "bindings" / "module.cc").read_text()
    assert "from_native" in module_cc and not re.search(r'cls = "\w+Error"', module_cc)
    from dpu import Dataplane, gen

    with pytest.raises(errors.UnknownFieldError) as e:  # dpu._core, through from_native
        Dataplane().add_flow("nw_dsst=1,actions=drop")
    assert e.value.position == 0
    with pytest.raises(errors.DpuIOError, match="No such file or directory") as e:  # dpu._gen, the same way
        gen.read_pcap("/nonexistent/x.pcap")
    assert e.value.file == "/nonexistent/x.pcap"
    assert type(errors.from_native("PCAP", "m", record=3)) is errors.PcapError
    assert type(errors.from_native("SOMETHING_NEW", "m")) is errors.DpuError


def test_api_scapy_packets_do_not_ask_the_host(monkeypatch):
    """Dataplane.process() given a scapy packet with unset addresses fills them
    like the CLI does, without touching the host, and leaves the caller's packet as it was."""
    from scapy.all import IP, UDP, Ether
    from scapy.config import conf
    import scapy.layers.l2 as l2

    from dpu import Dataplane

    def host(*a, **k):
        raise AssertionError("looked at the host's network")

    monkeypatch.setattr(conf.route, "route", host)
    monkeypatch.setattr(l2, "getmacbyip", host)
    pkt = Ether() / IP(dst="10.0.0.5") / UDP()
    dp = Dataplane(ports=["a", "b"], flows=["in_port=a,actions=output:b"])
    (out,) = dp.process(pkt, in_port="a")
    assert out.data[:12] == bytes.fromhex("ffffffffffff") + bytes(6)
    assert out.data[26:30] == bytes(4)
    assert "src" not in pkt[Ether].fields and "src" not in pkt[IP].fields


# ---- --ctl and offline inputs ---------------------------------------------------------------


def test_ctl_at_a_path_that_is_not_a_socket(work):
    for path, kind in ((work / "fwd.txt", "a file that is not a socket"), (work, "a directory")):
        one_error(dpu("stats", "--ctl", path), f"{path} is {kind}: no dpu control socket", code=1)
    one_error(dpu("stats", "--ctl", work / "none.ctl"), f"no dpu is running at {work / 'none.ctl'}", code=1)


@pytest.mark.parametrize("args,needle", [
    (["flows", "--ctl", "{ctl}", "{work}/fwd.txt"], "flows --ctl acts on the running dpu: a flows file is for offline"),
    (["flows", "--ctl", "{ctl}", "--config", str(TOPO)], "flows --ctl acts on the running dpu: --config is for offline"),
    (["trace", "--ctl", "{ctl}", "--config", str(TOPO), "--in-port", "vm1", "Ether()"],
     "trace --ctl acts on the running dpu: --config is for offline"),
    (["show", "--ctl", "{ctl}", "--flows", "{work}/fwd.txt", "--ports", "vm1,vm2"],
     "show --ctl acts on the running dpu: --flows and --ports are for offline"),
], ids=["flows file", "flows config", "trace", "show"])
def test_ctl_with_offline_inputs_is_refused(work, args, needle):
    """A command given both a running dpu (--ctl) and a dataplane to build
    offline says so, instead of quietly ignoring one of them."""
    r = dpu(*[a.format(ctl=work / "x.ctl", work=work) for a in args])
    one_error(r, needle, code=2)


def test_ctl_path_checks_before_anything_starts(work):
    """dpu run's --ctl: a regular file, a directory, a link to nothing or a
    path longer than sun_path is refused (dpu replaces only a stale socket)."""
    from dpu.errors import LiveError
    from dpu.control import check_ctl_path

    os.symlink(work / "nowhere", work / "dangling.ctl")
    for path, words in ((work / "fwd.txt", "a file that is not a socket"), (work, "a directory"),
                        (work / "dangling.ctl", "a symbolic link to nothing"),
                        (work / ("x" * 120), "too long for a unix socket")):
        with pytest.raises(LiveError, match=words):
            check_ctl_path(str(path))
    assert os.path.islink(work / "dangling.ctl") and (work / "fwd.txt").read_text() == FWD
    check_ctl_path(str(work / "new.ctl"))  # nothing there yet: fine
