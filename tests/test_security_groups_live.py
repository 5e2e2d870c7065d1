"""Security groups live (issue: security groups, "How we will know"): `dpu run` between
network namespaces with real TCP. vm2 is a web server whose group allows tcp 80 (and
ping from 10.0.0.0/8); vm1's group allows no ingress at all. An allowed connection
carries data for the whole test while a denied one never connects; the machine that
takes nothing new still gets the answers to what it starts (the internet through SNAT);
removing the rule in a reload cuts the established connection within a second, and
the new rules hold for new connections. Counters and the reload's answer say so."""
import re
import sys
import time

import pytest
import yaml

from livelab import SERVER_IP, Lab
from netns import nsexec

pytestmark = pytest.mark.usefixtures("netns_ok")

WEB_GROUPS = {
    "web": {"ingress": [{"proto": "tcp", "ports": 80, "from": "0.0.0.0/0"},
                        {"proto": "icmp", "from": "10.0.0.0/8"}]},
    "admin": {"ingress": []},
}


def sg_topology(lab, groups=WEB_GROUPS):
    path = lab.topology()
    with open(path) as f:
        t = yaml.safe_load(f)
    blue = t["tenants"]["blue"]
    blue["security_groups"] = groups
    blue["ports"]["vm1"]["security_groups"] = ["admin"]
    blue["ports"]["vm2"]["security_groups"] = ["web"]
    with open(path, "w") as f:
        yaml.safe_dump(t, f)
    return path


def connects(lab, where, dst, port, timeout=3.0):
    """Whether a TCP connection from the namespace gets established (a listener must be there)."""
    code = (f"import socket,sys\ns=socket.socket();s.settimeout({timeout})\n"
            f"try:\n s.connect(({dst!r},{port}));print('yes')\nexcept OSError as e:\n print('no',e)")
    r = nsexec(lab.ns[where], sys.executable, "-c", code, check=False)
    return r.stdout.startswith("yes")


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    lab = Lab(str(tmp_path_factory.mktemp("sglive")))
    yield lab
    lab.close()


def test_allowed_web_works_while_denied_never_connects_and_a_reload_cuts_it(lab):
    topo = sg_topology(lab)
    dpu = lab.start_dpu(topo)
    try:
        # a long transfer vm1 -> vm2:80 (routed between subnets), about 12 s at 200 KB/s
        srv, cli = lab.start_transfer("vm2", "vm1", "10.0.1.12", 80, 2_400_000, 200_000)
        # meanwhile: vm2 takes nothing on 22, vm1 takes nothing at all, ping to vm2 passes
        lab.peer("vm2", "whoami", "22", "ssh")
        lab.peer("vm1", "whoami", "8000", "admin")
        assert not connects(lab, "vm3", "10.0.1.12", 22)          # another tenant: isolated anyway
        assert not connects(lab, "vm1", "10.0.1.12", 22)
        assert not connects(lab, "vm2", "10.0.0.11", 8000)
        assert lab.ping("vm1", "10.0.1.12", count=2)
        # vm1 takes nothing new, but its own connection to the internet is answered
        lab.peer("inet", "whoami", "8443", "internet")
        assert connects(lab, "vm1", SERVER_IP, 8443)
        assert lab.finish(srv, cli, timeout=60) == "10.0.0.11"      # every byte, in order
        st = dpu.stats()
        assert st["tenants"]["blue"]["drops"].get("security_group", 0) >= 2
        rules = {(r["group"], r["rule"]): r["hits"] for r in st["security_groups"]["rules"]}
        assert rules[("web", 0)] >= 1 and rules[("web", 1)] >= 1

        # a transfer that a reload cuts: the web rule goes away
        srv, cli = lab.start_transfer("vm2", "vm1", "10.0.1.12", 80, 4_000_000, 200_000)
        time.sleep(1.0)
        with open(topo) as f:
            t = yaml.safe_load(f)
        t["tenants"]["blue"]["security_groups"]["web"]["ingress"].pop(0)
        with open(topo, "w") as f:
            yaml.safe_dump(t, f)
        t0 = time.monotonic()
        res = dpu.ctl_cmd("reload")
        m = re.search(r"(\d+) connections cut", res.stdout)
        assert m and int(m.group(1)) >= 1, res.stdout
        # the connection is gone from the table within a second, and the client's stream stalls
        while True:
            web = [ln for ln in dpu.ctl_cmd("ct", "dump").stdout.splitlines() if "dport=80," in ln]
            if not web or time.monotonic() > t0 + 1.0:
                break
            time.sleep(0.05)
        assert not web, web
        # what the client still sends is dropped: the connection is not tracked any more
        def dropped():
            d = dpu.stats()["tenants"]["blue"]["drops"]
            return d.get("ct_invalid", 0) + d.get("security_group", 0)
        before = dropped()
        time.sleep(1.5)
        assert dropped() > before
        assert cli.poll() is None          # stalled, not finished
        cli.kill()
        srv.kill()
        # and no new web connection gets through
        lab.peer("vm2", "whoami", "80", "web")
        assert not connects(lab, "vm1", "10.0.1.12", 80)
    finally:
        rc, out, err = dpu.stop()
    assert rc == 0, err
