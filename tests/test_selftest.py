"""Vectorised fast-path helpers agree with their plain versions (STYLE.md #8)."""
from dpu import _core


def test_simd_helpers_match_plain_versions():
    mismatches, filled_fast, filled_plain = _core.selftest_simd(200_000, 12345)
    assert mismatches == 0
    # 65,536 keys into 65,536 slots: a uniform hash fills about 1 - 1/e = 63.2%.
    for filled in (filled_fast, filled_plain):
        assert 0.60 < filled / 65536 < 0.66


def test_transmit_queue_reordering_matches_a_sort():
    # A queue of several ordered runs (after recirculation) leaves in arrival
    # order: merge_runs agrees with std::sort on 5,000 random cases.
    assert _core.selftest_merge_runs(5000, 99) == 0


def test_tcp_tracking_fast_path_matches_the_general_one():
    # The established ACK's window check inline (ct_tcp_fast) against
    # tcp_update itself on 1,000,000 random segments aimed at each bound of
    # the window check to within one: the same verdict, windows, states and
    # timeout class. Both sides of the check are exercised: segments the fast
    # path decided, and segments of its kind it left to tcp_update (which
    # must have found them unchanged). Moving any one of its five bounds by
    # one makes a thousand or more of these disagree.
    mismatches, fast, refused = _core.selftest_ct_tcp(1_000_000, 7)
    assert mismatches == 0
    assert fast > 20_000
    assert refused > 20_000
