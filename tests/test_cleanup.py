"""Tools and labs leave nothing behind (issue 26): dpu.cleanup, and everything that
uses it, on SIGTERM, SIGINT, SIGHUP or a normal exit.

Each case runs a child process that sets something up (a directory, a lab of
network namespaces with processes in them, Open vSwitch's daemons, a tool's
temporary directory), says on stdout where it is and waits; the test sends the
signal, then checks that the child ended as the signal says (killed by it, or
128 + its number where the tool exits by itself on SIGINT) and that everything
it named is gone: namespaces, processes, directories.
"""
import errno
import json
import os
import signal
import subprocess
import sys

import pytest

from helpers import child_env
from helpers.wait import wait_for

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

PRELUDE = """
import json, os, signal, sys, time
from dpu import cleanup
from helpers.wait import wait_for
def ready(**info):
    print(json.dumps(info), flush=True)
def wait_forever():  # idle until the test's signal ends the child: waiting is the point
    while True:
        time.sleep(60)
"""


_children = []


@pytest.fixture(autouse=True)
def _no_child_left():
    """A test that fails half-way does not leave its child (and what it made) behind."""
    yield
    while _children:
        p = _children.pop()
        if p.poll() is None:
            p.terminate()
            try:
                p.communicate(timeout=60)
            except subprocess.TimeoutExpired:  # blocked in native code, its handler never ran
                p.kill()
                p.communicate()


def _default_signals() -> None:
    """The child starts with the signals' default dispositions, whatever the runner passed
    down: under nohup SIGHUP comes ignored, and a shell without job control starts a command
    run with & with SIGINT ignored (Python then installs no KeyboardInterrupt handler);
    cleanup rightly leaves an ignored signal alone. The tests of that ignore it themselves."""
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)


def spawn(code: str, argv=None, **env) -> subprocess.Popen:
    """A child interpreter running PRELUDE + code (or argv), this checkout importable."""
    p = subprocess.Popen(argv or [sys.executable, "-c", PRELUDE + code], cwd=ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=child_env(**env), preexec_fn=_default_signals)
    _children.append(p)
    return p


def ready(p: subprocess.Popen) -> dict:
    line = p.stdout.readline()
    if not line:
        out, err = p.communicate(timeout=30)
        raise AssertionError(f"child exited ({p.returncode}) before it was ready: {err}")
    return json.loads(line)


def finish(p: subprocess.Popen, timeout: float = 60) -> tuple:
    out, err = p.communicate(timeout=timeout)
    return p.returncode, out, err


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_signal_runs_cleanups_then_ends_the_process_by_that_signal(tmp_path, sig):
    p = spawn(f"""
d = cleanup.TempDir(prefix="t-", dir={str(tmp_path)!r})
open(os.path.join(d.path, "f"), "w").close()
ready(path=d.path)
wait_forever()
""")
    path = ready(p)["path"]
    assert os.path.isdir(path)
    p.send_signal(sig)
    rc, _, err = finish(p)
    assert rc == -sig, err
    assert not os.path.exists(path)


def test_sigint_runs_cleanups_then_raises_keyboard_interrupt(tmp_path):
    """SIGINT's default Python handler is chained: the program sees KeyboardInterrupt
    after the cleanups ran (and a finally that closes again finds nothing to do)."""
    p = spawn(f"""
d = cleanup.TempDir(prefix="t-", dir={str(tmp_path)!r})
try:
    ready(path=d.path)
    wait_forever()
except KeyboardInterrupt:
    print("interrupted", os.path.exists(d.path), flush=True)
    d.remove()
    sys.exit(130)
""")
    path = ready(p)["path"]
    p.send_signal(signal.SIGINT)
    rc, out, err = finish(p)
    assert rc == 130, err
    assert out.split() == ["interrupted", "False"]
    assert not os.path.exists(path)


def test_a_handler_installed_before_is_chained_after_the_cleanups(tmp_path):
    p = spawn(f"""
def mine(sig, frame):
    print("mine", os.path.exists(d.path), flush=True)
    os._exit(3)
signal.signal(signal.SIGTERM, mine)
d = cleanup.TempDir(prefix="t-", dir={str(tmp_path)!r})
ready(path=d.path)
wait_forever()
""")
    path = ready(p)["path"]
    p.send_signal(signal.SIGTERM)
    rc, out, err = finish(p)
    assert (rc, out.split()) == (3, ["mine", "False"]), err
    assert not os.path.exists(path)


def test_cleanups_run_newest_first_and_a_failing_one_does_not_stop_the_others(tmp_path):
    log = tmp_path / "log"
    p = spawn(f"""
def note(what):
    with open({str(log)!r}, "a") as f:
        f.write(what + "\\n")
def broken():
    raise OSError("no such thing")
cleanup.register(note, "first")
cleanup.register(broken)
cleanup.register(note, "last")
ready()
wait_forever()
""")
    ready(p)
    p.send_signal(signal.SIGTERM)
    rc, _, err = finish(p)
    assert rc == -signal.SIGTERM
    assert log.read_text().split() == ["last", "first"]
    assert "failed: OSError: no such thing" in err


def test_a_failing_cleanup_is_an_error_record_of_the_log(tmp_path):
    """Under `dpu run --log-format json` a collector gets the failure as a record, not a bare line."""
    p = spawn("""
from dpu import logs
logs.setup("info", "json")
def broken():
    raise OSError("no such thing")
cleanup.register(broken)
ready()
wait_forever()
""")
    ready(p)
    p.send_signal(signal.SIGTERM)
    rc, _, err = finish(p)
    assert rc == -signal.SIGTERM
    records = [json.loads(line) for line in err.splitlines()]
    assert [(r["level"], r["logger"]) for r in records] == [("error", "dpu.cleanup")], err
    assert records[0]["message"].endswith("failed: OSError: no such thing"), err


def test_a_signal_inside_deferred_waits_for_the_block_and_misses_nothing(tmp_path):
    """The signal arrives while the block is making something its cleanup must
    remove; it is acted on when the block ends, and what the block made is gone."""
    p = spawn(f"""
made = []
cleanup.register(lambda: [os.rmdir(m) for m in made])
with cleanup.deferred():
    ready()
    wait_for(lambda: cleanup._pending, 60, "the test's signal (held until the block ends)")
    made.append(os.path.join({str(tmp_path)!r}, "made"))
    os.mkdir(made[-1])
print("after the block", flush=True)
""")
    ready(p)
    p.send_signal(signal.SIGTERM)
    rc, out, err = finish(p)
    assert rc == -signal.SIGTERM, err
    assert "after the block" not in out
    assert not (tmp_path / "made").exists()


def test_what_is_left_registered_runs_at_a_normal_exit(tmp_path):
    p = spawn(f"""
d = cleanup.TempDir(prefix="t-", dir={str(tmp_path)!r})
done = cleanup.register(print, "never")
done.cancel()
print(d.path, flush=True)
""")
    rc, out, err = finish(p)
    assert rc == 0, err
    assert out.split() == [out.split()[0]]  # the cancelled one did not run
    assert not os.path.exists(out.split()[0])


def test_a_forked_child_leaves_its_parents_cleanups_alone(tmp_path):
    p = spawn(f"""
d = cleanup.TempDir(prefix="t-", dir={str(tmp_path)!r})
pid = os.fork()
if pid == 0:
    sys.exit(0)  # the child's exit runs its atexit hooks: not the parent's cleanups
os.waitpid(pid, 0)
child = os.fork()
if child == 0:
    os.kill(os.getpid(), signal.SIGTERM)  # nor its signal handler
    wait_forever()
_, status = os.waitpid(child, 0)
ready(path=d.path, exists=os.path.exists(d.path), child_signal=os.WTERMSIG(status))
wait_forever()
""")
    info = ready(p)
    assert info["exists"] and info["child_signal"] == signal.SIGTERM
    p.send_signal(signal.SIGTERM)
    rc, _, err = finish(p)
    assert rc == -signal.SIGTERM, err
    assert not os.path.exists(info["path"])


def test_an_ignored_signal_stays_ignored(tmp_path):
    """nohup: SIGHUP ignored before the first registration does not end the process."""
    p = spawn(f"""
signal.signal(signal.SIGHUP, signal.SIG_IGN)
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1])
d = cleanup.TempDir(prefix="t-", dir={str(tmp_path)!r})
ready(path=d.path)
signal.sigwait([signal.SIGUSR1])
print("still here", os.path.exists(d.path), flush=True)
""")
    ready(p)
    p.send_signal(signal.SIGHUP)  # an ignored signal is discarded when it is sent
    p.send_signal(signal.SIGUSR1)
    rc, out, err = finish(p)
    assert rc == 0, err
    assert out.split() == ["still", "here", "True"]


# ---- labs and tools -------------------------------------------------------------------------

def namespaces() -> set:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def running(pid: int) -> bool:
    """Whether pid is a live process (a zombie nobody has reaped yet is not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def signalled(rc: int, sig: int) -> bool:
    return rc in (-sig, 128 + sig)


def check_setup_and_teardown(p: subprocess.Popen, sig: int, info: dict) -> None:
    """info names what the child made: all of it exists; after `sig` none of it does."""
    ns, pids, dirs = info.get("namespaces", []), info.get("pids", []), [d for d in (info.get("tmp"),) if d]
    assert set(ns) <= namespaces() and all(map(running, pids)) and all(map(os.path.isdir, dirs)), info
    p.send_signal(sig)
    rc, _, err = finish(p)
    assert signalled(rc, sig), f"exit status {rc}: {err[-2000:]}"
    assert not set(ns) & namespaces()
    wait_for(lambda: not any(map(running, pids)), 30, f"processes {pids} to end")
    assert not any(map(os.path.exists, dirs))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_live_bench_leaves_no_namespace_daemon_or_directory(netns_ok, sig):
    """bench/live_bench.py --hold: the rig of three namespaces, dpu run and Open vSwitch's
    ovsdb-server and ovs-vswitchd in it, its temporary directory with their databases."""
    from ovs_oracle import missing_reason
    why = missing_reason()
    if why:
        pytest.skip(why)
    p = spawn("", argv=[sys.executable, os.path.join(ROOT, "bench", "live_bench.py"), "--hold", "--scenarios",
                        "live-l3", "--io", "afpacket", "--workers", "1"])
    info = ready(p)
    assert len(info["namespaces"]) == 3 and len(info["pids"]) == 3, info  # dpu run, ovsdb-server, ovs-vswitchd
    check_setup_and_teardown(p, sig, info)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_the_live_lab_leaves_no_namespace_or_process(netns_ok, tmp_path, sig):
    """tests/livelab.py's Lab (eight namespaces) with a server running in one of them."""
    p = spawn(f"""
from livelab import Lab
lab = Lab({str(tmp_path)!r})
server = lab.peer("inet", "sink", "5001")
ready(namespaces=list(lab.ns.values()), pids=[server.pid])
wait_forever()
""")
    check_setup_and_teardown(p, sig, ready(p))


def test_the_kernel_vtep_and_host_pair_leave_no_namespace_or_capture(netns_ok, tmp_path):
    """tests/netns.py: a KernelVtep with tcpdump capturing in it, and a HostPair."""
    p = spawn(f"""
from netns import Capture, HostPair, KernelVtep
v = KernelVtep(vni=100, local="192.0.2.2", peer="192.0.2.1", local_mac="02:00:00:00:00:02",
               peer_mac="02:00:00:00:00:01", overlay_mac="02:00:00:00:01:21", overlay_ip="10.0.0.21",
               overlay_prefix=24, neighbours={{}}, fdb=[])
cap = v.capture_wire({str(tmp_path / "wire.pcap")!r}).start()
pair = HostPair("10.0.0.1", "10.0.0.2", "02:00:00:00:00:0a", "02:00:00:00:00:0b")
ready(namespaces=[v.fab, v.kern, pair.a, pair.b], pids=[cap.proc.pid])
wait_forever()
""")
    check_setup_and_teardown(p, signal.SIGTERM, ready(p))


def test_the_ovs_oracle_leaves_no_daemon_or_directory():
    """tests/ovs_oracle.py: its own ovsdb-server and ovs-vswitchd, their run directory."""
    from ovs_oracle import missing_reason
    why = missing_reason()
    if why:
        pytest.skip(why)
    p = spawn("""
from ovs_oracle import OvsOracle
o = OvsOracle(["p1", "p2"]).start()
ready(tmp=o.dir, pids=[q.pid for q in o.procs.values()])
wait_forever()
""")
    info = ready(p)
    assert len(info["pids"]) == 2, info
    check_setup_and_teardown(p, signal.SIGTERM, info)


def _tool_dir(tmp: str, prefix: str) -> str:
    wait_for(lambda: any(n.startswith(prefix) for n in os.listdir(tmp)), 30, f"the tool's {prefix}* directory")
    return next(os.path.join(tmp, n) for n in os.listdir(tmp) if n.startswith(prefix))


def test_bench_replay_10m_leaves_no_temporary_directory(tmp_path):
    """dpu bench replay-10m writes its capture and outputs (gigabytes at full size) into a
    temporary directory: gone when the bench is stopped in the middle."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    p = spawn("", argv=[sys.executable, "-m", "dpu.cli", "bench", "replay-10m", "--packets", "1000000", "--repeat",
                        "3"], TMPDIR=str(tmp))
    d = _tool_dir(str(tmp), "dpu-bench-")
    check_setup_and_teardown(p, signal.SIGTERM, {"tmp": d})


def _feed_fifo(path: str, data: bytes, p: subprocess.Popen, timeout: float = 30) -> None:
    """Writes data into the FIFO at path once child p has opened it for reading. The signal
    may also reach the child after its directory exists and before its replay opens the
    FIFO: its handler then runs at once and the child ends without ever opening it, and a
    blocking open for writing would wait for a reader for ever."""
    def reader_or_gone():  # [fd], or [-1] once the child has ended (a list: fd 0 is false)
        if p.poll() is not None:
            return [-1]
        try:
            return [os.open(path, os.O_WRONLY | os.O_NONBLOCK)]
        except OSError as e:
            if e.errno != errno.ENXIO:  # ENXIO: no reader yet
                raise
            return None
    [fd] = wait_for(reader_or_gone, timeout, "the child opening its FIFO, or ending")
    if fd < 0:
        return
    try:
        os.set_blocking(fd, True)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def test_ct_dump_leaves_no_temporary_directory(tmp_path):
    """dpu ct dump replays into a temporary directory. Its capture is a FIFO: the replay
    waits for it, the signal arrives meanwhile and is acted on once the replay returns (or,
    arriving before the replay opens the FIFO, at once); either way the directory goes."""
    from netns import write_pcap
    from helpers.packets import PKT_UDP

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    fifo = tmp_path / "in.pcap"
    os.mkfifo(fifo)
    flows = tmp_path / "flows"
    flows.write_text("table=0,priority=1,ip,actions=ct(commit,zone=1)\n")
    write_pcap(str(tmp_path / "one.pcap"), [bytes(PKT_UDP)])
    p = spawn("", argv=[sys.executable, "-m", "dpu.cli", "ct", "dump", "--flows", str(flows), "--in",
                        f"p1={fifo}"], TMPDIR=str(tmp))
    d = _tool_dir(str(tmp), "dpu-ct-")
    assert os.path.isdir(d)
    p.send_signal(signal.SIGTERM)
    _feed_fifo(str(fifo), (tmp_path / "one.pcap").read_bytes(), p)  # the replay, and with it the handler, goes on
    rc, out, err = finish(p)
    assert rc == -signal.SIGTERM, err
    assert not os.path.exists(d)
