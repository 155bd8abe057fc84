#!/usr/bin/env python3
"""Unit tests of bench/windows.py's tallies, on windows shaped as `checkout loadgen --json`
writes them (CI: `python3 -m unittest discover -s bench -p 'test_*.py'`). A refusal that the
tally misses makes every noise window look clean, so the counts are pinned here."""

import contextlib
import io
import unittest

import windows


def window(from_s, to_s, outcomes, p99_ms):
    return {
        "from_s": from_s, "to_s": to_s, "outcomes": outcomes, "p99_ms": p99_ms, "late": 0,
        "error_p50_ms": 3.0 if len(outcomes) > 1 else None,
        "error_p99_ms": 9.0 if len(outcomes) > 1 else None, "procs": [],
    }


class Refused(unittest.TestCase):
    def test_every_resource_exhausted_outcome_is_a_refusal(self):
        w = window(0, 30, {
            "CONFIRMED": 100,
            "error ResourceExhausted OVERLOADED with RetryInfo": 7,
            "error ResourceExhausted": 2,
            "error Unavailable STORE_UNAVAILABLE with RetryInfo": 5,
            "DECLINED INVENTORY_UNAVAILABLE": 1,
        }, 20.0)
        self.assertEqual(windows.refused(w), 9)

    def test_a_window_without_refusals_counts_none(self):
        self.assertEqual(windows.refused(window(0, 30, {"CONFIRMED": 100}, 20.0)), 0)

    def test_refusals_beside_a_fast_p99_are_needless_and_beside_a_slow_one_are_not(self):
        run = {"lane": "serve-sqlite", "mode": "open", "connections": 1, "outcomes": {}}
        ws = [
            window(0, 30, {"CONFIRMED": 90, "error ResourceExhausted OVERLOADED with RetryInfo": 4}, 200.0),
            window(30, 60, {"CONFIRMED": 90, "error ResourceExhausted OVERLOADED with RetryInfo": 6}, 1500.0),
        ]
        with contextlib.redirect_stdout(io.StringIO()) as out:
            needless, late = windows.rows(run, ws, 2000.0)
        self.assertEqual((needless, late), (4, 0))
        self.assertIn("10 refused (4 needless)", out.getvalue())


def scrape(counts):
    """A /metrics text with PlaceOrder's RESOURCE_EXHAUSTED buckets at `counts` (cumulative,
    per bound in seconds), an OK series beside it that must not count."""
    lines = ["# TYPE rpc_server_call_duration_seconds histogram"]
    for le, n in counts.items():
        bound = "+Inf" if le == float("inf") else repr(le)
        lines.append('rpc_server_call_duration_seconds_bucket{le="%s",rpc_method="checkout.v1.'
                     'CheckoutService/PlaceOrder",rpc_status_code="RESOURCE_EXHAUSTED"} %d'
                     % (bound, n))
        lines.append('rpc_server_call_duration_seconds_bucket{le="%s",rpc_method="checkout.v1.'
                     'CheckoutService/PlaceOrder",rpc_status_code="OK"} %d' % (bound, 10 * n + 5))
    return "\n".join(lines) + "\n"


class ServerRefusals(unittest.TestCase):
    def test_the_quantiles_are_of_the_refusals_between_the_scrapes(self):
        inf = float("inf")
        before = scrape({0.001: 100, 0.005: 100, 0.05: 100, inf: 100})
        # 1,000 more: 980 within 1 ms, 15 more within 5 ms, the last 5 within 50 ms.
        after = scrape({0.001: 1080, 0.005: 1095, 0.05: 1100, inf: 1100})
        self.assertEqual(windows.server_refusals(before, after), (1000, 1.0, 5.0))

    def test_no_refusals_between_the_scrapes_has_no_quantiles(self):
        same = scrape({0.001: 7, float("inf"): 7})
        self.assertEqual(windows.server_refusals(same, same), (0, None, None))
        self.assertEqual(windows.server_refusals("", ""), (0, None, None))


if __name__ == "__main__":
    unittest.main()
