"""Shared fixtures: skips that say why, and small helpers."""
import os
import shutil
import subprocess
import sys

import pytest


def pytest_configure(config):
    config.addinivalue_line("markers", "netns: needs root and network namespaces")
    config.addinivalue_line("markers", "tshark: needs tshark")


@pytest.fixture
def tshark():
    path = shutil.which("tshark")
    if not path:
        pytest.skip("tshark is not installed (apt-get install tshark; CI installs it)")
    return path


def can_netns() -> bool:
    if os.geteuid() != 0 or not shutil.which("ip"):
        return False
    r = subprocess.run(["ip", "netns", "add", "dpu-probe"], capture_output=True)
    if r.returncode != 0:
        return False
    subprocess.run(["ip", "netns", "del", "dpu-probe"], capture_output=True)
    return True


@pytest.fixture(scope="session")
def netns_ok():
    if not can_netns():
        pytest.skip("needs root and network namespaces (CI runs as root)")
    return True


@pytest.fixture
def run_python():
    """Runs Python code in a child interpreter with this checkout importable: for
    what could crash or bloat the test process. Asserts a zero exit status and
    returns the child's stdout."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def run(code: str, timeout: int = 120) -> str:
        env = {**os.environ, "PYTHONPATH": root}
        r = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True,
                           timeout=timeout, env=env)
        assert r.returncode == 0, f"exit status {r.returncode}: {r.stderr[-2000:]}"
        return r.stdout
    return run
