"""Golden captures (pcap/README.md): every case replays to the same bytes."""
import importlib.util
import os

import pytest
from scapy.all import rdpcap

HERE = os.path.join(os.path.dirname(__file__), "..", "pcap")
spec = importlib.util.spec_from_file_location("make_golden", os.path.join(HERE, "make_golden.py"))
make_golden = importlib.util.module_from_spec(spec)
spec.loader.exec_module(make_golden)

# Independent expectations, so a wrong golden file cannot pass by itself:
# packets in, and packets out on each output port.
EXPECTED_COUNTS = {
    "l3-rewrite": (60, {"r1": 35}), "vxlan-encap": (40, {"p0": 40}), "vxlan-decap": (40, {"vm1": 10}),
    "arp-suppression": (20, {"vm1": 16}),
    "nat-snat": (28, {"inet": 16, "vm1": 8, "vm2": 4}),
    "nat-dnat": (21, {"vm2": 10, "inet": 10}),
    "nat-hairpin": (12, {"vm2": 6, "vm1": 6}),
    "nat-icmp-error": (16, {"inet": 8, "vm1": 8}),
}


def compare(case, port, got_path, want_path):
    got, want = open(got_path, "rb").read(), open(want_path, "rb").read()
    if got == want:
        return
    g, w = rdpcap(str(got_path)), rdpcap(want_path)
    for i, (a, b) in enumerate(zip(g, w)):
        assert bytes(a) == bytes(b), f"{case} {port}: packet {i}\n--- expected\n{b.show2(dump=True)}\n--- got\n{a.show2(dump=True)}"
    assert len(g) == len(w), f"{case} {port}: {len(g)} packets, expected {len(w)}"
    assert got == want, f"{case} {port}: timestamps or headers differ"


@pytest.mark.parametrize("case", sorted(make_golden.CASES))
def test_golden_case(case, tmp_path):
    c = make_golden.CASES[case]
    dp = make_golden.build_dataplane(c)
    s = dp.replay({p: make_golden.in_file(case, p) for p in make_golden.ports_of(c, "in")}, tmp_path)
    n_in, n_out = EXPECTED_COUNTS[case]
    assert s.packets_in == n_in
    for port in make_golden.ports_of(c, "out"):
        compare(case, port, tmp_path / f"{port}.pcap", make_golden.out_file(case, port))
        assert s.ports[port]["tx_packets"] == n_out[port], (case, port)


@pytest.mark.parametrize("case", sorted(c for c in make_golden.CASES if c.startswith("nat-")))
def test_golden_outputs_valid_on_the_wire(case, tshark):
    """tshark, checksums checked, finds nothing wrong in the NAT cases' outputs
    (the ICMP errors' quoted headers included). The other cases' outputs are
    checked by test_wire.py."""
    from helpers.tshark import assert_clean

    c = make_golden.CASES[case]
    for port in make_golden.ports_of(c, "out"):
        assert_clean(tshark, make_golden.out_file(case, port), EXPECTED_COUNTS[case][1][port])


def test_golden_inputs_are_reproducible(tmp_path, monkeypatch):
    """The script rebuilds the same input captures (fixed seeds and timestamps)."""
    import random
    from scapy.all import wrpcap

    for case, c in make_golden.CASES.items():
        if isinstance(c["in"], list):
            monkeypatch.setattr(make_golden, "in_file", lambda cs, p: str(tmp_path / f"{cs}.{p}.in.pcap"))
            make_golden.write_inputs(case, random.Random(case))
            monkeypatch.undo()
            for p in c["in"]:
                assert (tmp_path / f"{case}.{p}.in.pcap").read_bytes() == open(make_golden.in_file(case, p), "rb").read()
            continue
        f = tmp_path / f"{case}.in.pcap"
        wrpcap(str(f), make_golden.traffic(case, random.Random(case)))
        assert f.read_bytes() == open(make_golden.in_file(case, c["in"]), "rb").read(), case
