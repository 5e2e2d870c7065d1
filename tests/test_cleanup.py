"""dpu.cleanup (issue 26): what a process registers is removed when it ends by SIGTERM,
SIGINT, SIGHUP or a normal exit, and the process still ends as the signal says.

Each case runs a child interpreter that registers a cleanup (the removal of a
directory it made), says on stdout where it is and waits; the test sends the
signal, then checks the child's exit status and that the directory is gone.
"""
import json
import os
import signal
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

PRELUDE = f"""
import json, os, signal, sys, time
sys.path.insert(0, {HERE!r})
from dpu import cleanup
def ready(**info):
    print(json.dumps(info), flush=True)
def wait_forever():
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


def spawn(code: str, argv=None, **env) -> subprocess.Popen:
    """A child interpreter running PRELUDE + code (or argv), this checkout importable."""
    p = subprocess.Popen(argv or [sys.executable, "-c", PRELUDE + code], cwd=ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": ROOT, **env})
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


def test_a_signal_inside_deferred_waits_for_the_block_and_misses_nothing(tmp_path):
    """The signal arrives while the block is making something its cleanup must
    remove; it is acted on when the block ends, and what the block made is gone."""
    p = spawn(f"""
made = []
cleanup.register(lambda: [os.rmdir(m) for m in made])
with cleanup.deferred():
    ready()
    while not cleanup._pending:  # until the test's signal has arrived (and been held)
        time.sleep(0.01)
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

