#!/usr/bin/env python3
"""Reads `checkout loadgen --json` lines (stdin) and prints what bench/run's soak, noise and
surge modes report per window and per run: goodput, refusals and how fast they were answered,
the admitted orders' p99, late answers, and each process's resident memory.

    bench/windows.py noise   DEADLINE_MS   a row per window; a refusal in a window whose
                                           admitted orders answered within half their deadline
                                           is an order refused while its deadline could afford
                                           the wait ("needless")
    bench/windows.py soak    DEADLINE_MS   the same rows; then memory growth after the first
                                           minute, per process
    bench/windows.py surge   DEADLINE_MS SURGE_FROM_S SURGE_TO_S SATURATION_PER_S
                                           before / during / after the surge: goodput (and
                                           during it, as a share of the saturation measured
                                           first), refusals and their p99 at the client,
                                           the admitted orders' p99
    bench/windows.py server-refusals BEFORE AFTER
                                           serve's own time for the refusals between two
                                           scrapes of its /metrics (files): the
                                           RESOURCE_EXHAUSTED answers of PlaceOrder in
                                           rpc_server_call_duration_seconds, p50 and p99 as
                                           the bucket bounds they fall under

Every figure is computed from the loader's own tallies; nothing is judged here but what the
rows say (bench/run never fails on speed). Goodput counts CONFIRMED answers: orders that were
admitted, decided and answered in time.
"""

import json
import sys


def runs_of(lines):
    """Groups window objects by (lane, mode, round, connections of the run that follows)."""
    groups, current = [], []
    for line in lines:
        line = line.strip()
        if not line.startswith("{"):
            continue
        obj = json.loads(line)
        if obj.get("kind") == "window":
            current.append(obj)
        elif obj.get("kind") == "run":
            groups.append((obj, current))
            current = []
    return groups


def confirmed(w):
    return w["outcomes"].get("CONFIRMED", 0)


def refused(w):
    # loadgen names an error outcome by its code and then its reason, e.g. "error
    # ResourceExhausted OVERLOADED with RetryInfo": every RESOURCE_EXHAUSTED is a refusal.
    return sum(n for k, n in w["outcomes"].items() if k.split()[:2] == ["error", "ResourceExhausted"])


def rss(w, name):
    for p in w["procs"]:
        if (name == "server" and p["server"]) or p["name"] == name:
            return p["rss_mb"]
    return None


def fmt(x, digits=1):
    return "-" if x is None else f"{x:.{digits}f}"


def rows(run, windows, deadline_ms):
    half = deadline_ms / 2
    print(f"\n{run['lane']} ({run['mode']}, {run.get('connections', '?')} connection(s)):")
    print(f"{'window':>10} {'goodput/s':>10} {'refused':>8} {'refusal p99':>12} {'admitted p99':>13}"
          f" {'late':>5} {'serve MB':>9} {'stubs MB':>9}  verdict")
    needless = 0
    for w in windows:
        seconds = max(w["to_s"] - w["from_s"], 1)
        r = refused(w)
        verdict = ""
        if r and w["p99_ms"] < half:
            verdict = f"needless: {r} refused while admitted orders answered by p99 {w['p99_ms']:.0f} ms"
            needless += r
        elif r:
            verdict = "refusals while the deadline was at risk"
        print(f"{w['from_s']:>4}-{w['to_s']:<4}s {confirmed(w) / seconds:>10.0f} {r:>8} "
              f"{fmt(w['error_p99_ms']):>12} {w['p99_ms']:>13.1f} {w['late']:>5} "
              f"{fmt(rss(w, 'server'), 0):>9} {fmt(rss(w, 'stubs'), 0):>9}  {verdict}")
    total = sum(confirmed(w) for w in windows)
    refusals = sum(refused(w) for w in windows)
    late = sum(w["late"] for w in windows)
    print(f"  total: {total} CONFIRMED, {refusals} refused ({needless} needless), {late} late;"
          f" outcomes {run['outcomes']}")
    return needless, late


def memory(windows):
    after_minute = [w for w in windows if w["from_s"] >= 60]
    if len(after_minute) < 2:
        return
    first, last = after_minute[0], after_minute[-1]
    for name in ("server", "stubs"):
        a, b = rss(first, name), rss(last, name)
        if a and b:
            print(f"  {name} RSS after the first minute: {a:.0f} -> {b:.0f} MB "
                  f"({(b - a) / a * 100:+.1f} %)")


def surge(run, windows, deadline_ms, start, stop, saturation):
    print(f"\n{run['lane']} surge ({run.get('connections', '?')} connection(s)), "
          f"surge from {start} s to {stop} s of the measured time:")
    parts = {
        "before": [w for w in windows if w["to_s"] <= start],
        "surge": [w for w in windows if w["from_s"] >= start and w["to_s"] <= stop],
        "after": [w for w in windows if w["from_s"] >= stop],
    }
    print(f"{'part':>7} {'goodput/s':>10} {'x saturation':>13} {'refused':>8} {'refusal p50':>12}"
          f" {'refusal p99':>12} {'admitted p99':>13} {'late':>5}")
    for name, ws in parts.items():
        if not ws:
            continue
        seconds = sum(max(w["to_s"] - w["from_s"], 1) for w in ws)
        good = sum(confirmed(w) for w in ws) / seconds
        r = sum(refused(w) for w in ws)
        # Window p99s cannot be merged exactly; the worst window's is reported (an upper bound).
        p99 = max(w["p99_ms"] for w in ws)
        rp50 = max((w["error_p50_ms"] for w in ws if w["error_p50_ms"] is not None), default=None)
        rp99 = max((w["error_p99_ms"] for w in ws if w["error_p99_ms"] is not None), default=None)
        share = f"{good / saturation:.2f}x" if saturation else "-"
        print(f"{name:>7} {good:>10.0f} {share:>13} {r:>8} {fmt(rp50):>12} {fmt(rp99):>12}"
              f" {p99:>13.1f} {sum(w['late'] for w in ws):>5}")
    print(f"  the whole run: refusals answered p99 {fmt(run['error_p99_ms'])} ms at the client "
          f"({run['errors']} errors); outcomes {run['outcomes']}")


def refusal_buckets(text):
    """PlaceOrder's RESOURCE_EXHAUSTED buckets in a Prometheus text scrape: {le: count}."""
    buckets = {}
    for line in text.splitlines():
        if not line.startswith("rpc_server_call_duration_seconds_bucket{"):
            continue
        labels, _, value = line.rpartition("} ")
        pairs = dict(
            part.split("=", 1) for part in labels.split("{", 1)[1].split(",") if "=" in part
        )
        if (pairs.get("rpc_method") == '"checkout.v1.CheckoutService/PlaceOrder"'
                and pairs.get("rpc_status_code") == '"RESOURCE_EXHAUSTED"'):
            buckets[float(pairs["le"].strip('"'))] = float(value.split()[0])
    return buckets


def server_refusals(before, after):
    """Refusals between two scrapes and the bucket bounds (ms) their p50 and p99 fall under:
    (count, p50_ms, p99_ms); the quantiles are None without refusals."""
    old, new = refusal_buckets(before), refusal_buckets(after)
    delta = {le: new[le] - old.get(le, 0.0) for le in sorted(new)}
    total = delta.get(float("inf"), 0.0)
    if total <= 0:
        return 0, None, None

    def bound(q):
        return next(le * 1000 for le, n in delta.items() if n >= q * total)

    return int(total), bound(0.5), bound(0.99)


def main():
    if sys.argv[1] == "server-refusals":
        with open(sys.argv[2]) as before, open(sys.argv[3]) as after:
            count, p50, p99 = server_refusals(before.read(), after.read())
        if count == 0:
            print("  serve's own time for refusals: none refused")
        else:
            print(f"  serve's own time for the {count} refusals (rpc_server_call_duration_seconds, "
                  f"RESOURCE_EXHAUSTED, from the call entering the service to its answer): "
                  f"p50 <= {fmt(p50, 0)} ms, p99 <= {fmt(p99, 0)} ms (bucket bounds)")
        return
    mode, deadline_ms = sys.argv[1], float(sys.argv[2])
    groups = runs_of(sys.stdin)
    for run, windows in groups:
        if mode in ("noise", "soak"):
            rows(run, windows, deadline_ms)
            memory(windows)
        elif mode == "surge":
            start, stop, saturation = float(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
            surge(run, windows, deadline_ms, start, stop, saturation)


if __name__ == "__main__":
    main()
