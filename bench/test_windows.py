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


if __name__ == "__main__":
    unittest.main()
