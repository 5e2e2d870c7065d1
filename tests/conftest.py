"""Shared fixtures: skips that say why, and small helpers."""
import os
import shutil
import subprocess

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
