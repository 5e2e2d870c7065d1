"""Golden captures (pcap/README.md): every case replays to the same bytes."""
import importlib.util
import os

import pytest
from scapy.all import rdpcap

HERE = os.path.join(os.path.dirname(__file__), "..", "pcap")
spec = importlib.util.spec_from_file_location("make_golden", os.path.join(HERE, "make_golden.py"))
make_golden = importlib.util.module_from_spec(spec)
spec.loader.exec_module(make_golden)

# Independent expectations, so a wrong golden file cannot pass by itself.
EXPECTED_COUNTS = {"l3-rewrite": (60, 35), "vxlan-encap": (40, 40), "vxlan-decap": (40, 10), "arp-suppression": (20, 16)}


@pytest.mark.parametrize("case", sorted(make_golden.CASES))
def test_golden_case(case, tmp_path):
    c = make_golden.CASES[case]
    src = os.path.join(HERE, f"{case}.in.pcap")
    dp = make_golden.build_dataplane(c)
    s = dp.replay({c["in"]: src}, tmp_path)
    got = (tmp_path / f"{c['out']}.pcap").read_bytes()
    want = open(os.path.join(HERE, f"{case}.out.pcap"), "rb").read()
    if got != want:
        g, w = rdpcap(str(tmp_path / f"{c['out']}.pcap")), rdpcap(os.path.join(HERE, f"{case}.out.pcap"))
        for i, (a, b) in enumerate(zip(g, w)):
            assert bytes(a) == bytes(b), f"{case}: packet {i}\n--- expected\n{b.show2(dump=True)}\n--- got\n{a.show2(dump=True)}"
        assert len(g) == len(w), f"{case}: {len(g)} packets, expected {len(w)}"
        assert got == want, f"{case}: timestamps or headers differ"
    assert (s.packets_in, s.ports[c["out"]]["tx_packets"]) == EXPECTED_COUNTS[case]


def test_golden_inputs_are_reproducible(tmp_path):
    """The script rebuilds the same input captures (fixed seeds and timestamps)."""
    import random
    from scapy.all import wrpcap

    for case in make_golden.CASES:
        f = tmp_path / f"{case}.in.pcap"
        wrpcap(str(f), make_golden.traffic(case, random.Random(case)))
        assert f.read_bytes() == open(os.path.join(HERE, f"{case}.in.pcap"), "rb").read(), case
