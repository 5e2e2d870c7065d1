"""What dpu says while it runs is a log record (issue 30; dpu/logs.py): a level and a time on
every line, --log-level and --log-format text|json on every command (before or after its
name), the journal's priority prefix when stderr is the journal, and a command's failure as
an error record under --log-format json. The json log of a whole `dpu run` is checked in
tests/test_views_json.py; here a `dpu run --log-level warning` shows its warnings and no info.
"""
import json
import logging
import os
import re
import subprocess
import sys

import pytest

from dpu import logs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOPO = os.path.join(ROOT, "examples", "topology.yaml")
TEXT_LINE = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z dpu: (debug|info|warning|error): (.*)")


@pytest.fixture
def dpu_logger():
    """The `dpu` logger as a test left it is put back: setup() changes it for the whole process."""
    root = logging.getLogger("dpu")
    saved = root.handlers[:], root.level, root.propagate
    yield root
    root.handlers[:], root.level, root.propagate = saved


def dpu(*args, env=None, stderr=subprocess.PIPE):
    return subprocess.run([sys.executable, "-m", "dpu.cli", *args], stdout=subprocess.PIPE, stderr=stderr,
                          text=True, timeout=120, cwd=ROOT, env={**os.environ, **(env or {})})


def test_text_lines_have_time_and_level_and_no_control_characters(dpu_logger, capsys):
    logs.setup("info", "text")
    log = logging.getLogger("dpu.test")
    log.debug("not shown")
    log.info("port %s up", "vm1")
    log.warning("a \x1b[31mred\x1b[0m name")
    lines = capsys.readouterr().err.splitlines()
    assert [TEXT_LINE.fullmatch(line).groups() for line in lines] == [
        ("info", "port vm1 up"), ("warning", "a \\x1b[31mred\\x1b[0m name")], lines


def test_json_records_carry_time_level_logger_message_and_fields(dpu_logger, capsys):
    logs.setup("debug", "json")
    log = logging.getLogger("dpu.test")
    log.debug("scrape from %s", "127.0.0.1", extra={"client": "127.0.0.1", "n": 3})
    try:
        raise ValueError("boom")
    except ValueError:
        log.error("failed", exc_info=True)
    a, b = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert {k: a[k] for k in ("level", "logger", "message", "client", "n")} == {
        "level": "debug", "logger": "dpu.test", "message": "scrape from 127.0.0.1", "client": "127.0.0.1", "n": 3}
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", a["time"])
    assert b["level"] == "error" and "ValueError: boom" in b["exc"]


def test_level_warning_hides_info(dpu_logger, capsys):
    logs.setup("warning", "text")
    logging.getLogger("dpu.test").info("hidden")
    logging.getLogger("dpu.test").warning("shown")
    assert [TEXT_LINE.fullmatch(x).group(2) for x in capsys.readouterr().err.splitlines()] == ["shown"]


@pytest.mark.parametrize("where", ["before", "after"])
def test_the_options_go_before_or_after_the_command(where):
    """DPU_LOG that names no level is itself a warning record, in the format asked for."""
    opts = ["--log-format", "json"]
    args = opts + ["compile", TOPO] if where == "before" else ["compile", TOPO] + opts
    r = dpu(*args, env={"DPU_LOG": "loud"})
    assert r.returncode == 0 and r.stdout.startswith("# dpu compile"), r.stderr
    (rec,) = [json.loads(line) for line in r.stderr.splitlines()]
    assert rec["level"] == "warning" and "DPU_LOG='loud' is not a level" in rec["message"]


def test_a_failure_is_one_line_or_an_error_record():
    text = dpu("compile", "nosuch.yaml")
    js = dpu("--log-format", "json", "compile", "nosuch.yaml")
    assert text.returncode == js.returncode == 1
    assert text.stderr == "dpu: DpuIOError: nosuch.yaml: no such topology file\n"
    (rec,) = [json.loads(line) for line in js.stderr.splitlines()]
    assert rec["level"] == "error" and rec["message"] == "DpuIOError: nosuch.yaml: no such topology file"


def test_a_bad_level_or_format_is_a_usage_error():
    for args in (["--log-level", "loud", "compile", TOPO], ["compile", TOPO, "--log-format", "xml"]):
        r = dpu(*args)
        assert r.returncode == 2 and "invalid choice" in r.stderr and r.stdout == "", r.stderr


def test_under_journald_lines_carry_the_priority_and_no_time(tmp_path):
    """JOURNAL_STREAM naming stderr (as systemd sets it): `<4>dpu: warning: ...`; naming another
    file (a child whose stderr was redirected): the usual line with its time."""
    err = tmp_path / "stderr"
    with open(err, "w") as f:
        st = os.fstat(f.fileno())
        dpu("compile", TOPO, env={"DPU_LOG": "loud", "JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}, stderr=f)
    assert err.read_text() == "<4>dpu: warning: DPU_LOG='loud' is not a level (debug, info, warning, error); using info\n"
    with open(err, "w") as f:
        dpu("compile", TOPO, env={"DPU_LOG": "loud", "JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino + 1}"}, stderr=f)
    assert TEXT_LINE.fullmatch(err.read_text().rstrip("\n")).group(1) == "warning"


def test_dpu_run_at_level_warning_says_no_info(tmp_path):
    """A real `dpu run` (root: a namespace and a veth): its warnings (topology ports without an
    interface), each a text line with its time, and not its start, which is info."""
    if os.geteuid() != 0:
        pytest.skip("dpu run needs root (a network namespace, AF_PACKET)")
    from dpu.control import call
    from netns import DpuOnVeth

    with DpuOnVeth(str(tmp_path / "dpu.ctl"), "--config", TOPO, "--port", "vm1=dpa", "--log-level", "warning",
                   cwd=ROOT) as d:
        assert call(d.ctl, "ping")["pid"]
    assert d.returncode == 0, d.err
    said = [TEXT_LINE.fullmatch(line) for line in d.err.splitlines()]
    assert said and all(said), d.err
    assert {m.group(1) for m in said} == {"warning"}, d.err
    assert any("vm2" in m.group(2) for m in said) and "forwarding on" not in d.err, d.err
    assert "Ports:" in d.out


def test_what_the_native_core_says_is_a_record(tmp_path):
    """The core queues what it says (native/src/core_log.h) and dpu run logs it: an interface
    deleted and created again is reattached, said as an info record of dpu.core in json."""
    if os.geteuid() != 0:
        pytest.skip("dpu run needs root (a network namespace, AF_PACKET)")
    from dpu.control import call
    from helpers.wait import wait_for
    from netns import DpuOnVeth, ip

    frame = bytes.fromhex("ffffffffffff020000000111" "0806") + bytes(46)
    with DpuOnVeth(str(tmp_path / "dpu.ctl"), "--config", TOPO, "--port", "vm1=dpa", ipv6=False,
                   global_args=("--log-format", "json"), cwd=ROOT) as d:
        ip(d.ns, "link", "del", "dpa")
        ip(d.ns, "link", "add", "dpa", "type", "veth", "peer", "name", "dpb")
        ip(d.ns, "link", "set", "dpa", "up")
        ip(d.ns, "link", "set", "dpb", "up")

        def received():  # by the new interface's sockets: reattached
            d.send(frame)
            return call(d.ctl, "stats")["ports"]["vm1"]["rx_packets"]
        wait_for(received, what="dpu to receive on the interface created again")
    assert d.returncode == 0, d.err
    records = [json.loads(line) for line in d.err.splitlines()]
    core = [r for r in records if r["logger"] == "dpu.core"]
    assert [(r["level"], r["message"]) for r in core] == [("info", "interface dpa was created again: reattached")]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", core[0]["time"])
