#!/usr/bin/env python3
"""The verdict of scripts/soak.sh (see its header for the bounds and why).

Reads the samples CSV and the JSON files the soak wrote, prints one line per check and
exits with 1 when any check fails. Python 3 standard library only.
"""

import argparse
import csv
import json
import sys


def slope_per_minute(points):
    """Least-squares slope of (seconds, value) points, per minute."""
    n = len(points)
    mean_t = sum(t for t, _ in points) / n
    mean_v = sum(v for _, v in points) / n
    var = sum((t - mean_t) ** 2 for t, _ in points)
    if var == 0:
        return 0.0
    cov = sum((t - mean_t) * (v - mean_v) for t, v in points)
    return cov / var * 60.0


def read_json(path):
    try:
        with open(path, encoding="utf-8") as f:
            lines = [line for line in f if line.strip().startswith("{")]
        return json.loads(lines[-1]) if lines else None
    except (OSError, ValueError):
        return None


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--csv", required=True)
    p.add_argument("--feed-secs", type=float, required=True)
    p.add_argument("--retention-secs", type=float, required=True)
    p.add_argument("--rate", type=float, required=True)
    p.add_argument("--rss-slope-bound", type=float, required=True, help="MiB/min")
    p.add_argument("--posts-tolerance", type=float, required=True, help="e.g. 0.10")
    p.add_argument("--lag-bound-secs", type=float, required=True)
    p.add_argument("--fd-growth-bound", type=int, required=True)
    p.add_argument("--stats-interval-secs", type=float, default=5.0)
    p.add_argument("--loadgen", required=True, help="loadgen output (JSON line last)")
    p.add_argument("--server-statuses", required=True,
                   help="JSON {status: count} of the server's own request counter")
    p.add_argument("--server-degraded", type=int, required=True)
    p.add_argument("--replica", required=True, help="answers_compare output vs the fresh replica")
    p.add_argument("--restart", required=True, help="answers_compare output after the restart")
    p.add_argument("--snapshot-loaded-posts", type=int, required=True)
    a = p.parse_args(argv)

    results = []

    def check(name, ok, detail):
        results.append(ok)
        print(f"{'PASS' if ok else 'FAIL'}  {name}: {detail}")

    def report(name, detail):
        print(f"info  {name}: {detail}")

    with open(a.csv, encoding="utf-8") as f:
        rows = [r for r in csv.DictReader(f)]
    feed = [r for r in rows if r["phase"] == "feed"]
    num = lambda r, k: float(r[k]) if r[k] not in ("", None) else None  # noqa: E731
    # The producer paces itself but may end late on a busy machine: the feed is what was sampled.
    feed_secs = max([a.feed_secs] + [float(r["t_secs"]) for r in feed])
    half = feed_secs / 2
    second = [r for r in feed if float(r["t_secs"]) >= half]
    first = [r for r in feed if float(r["t_secs"]) < half]

    # RSS slope over the second half of the feed.
    rss = [(float(r["t_secs"]), num(r, "rss_mib")) for r in second if num(r, "rss_mib")]
    if len(rss) >= 3:
        slope = slope_per_minute(rss)
        check("RSS slope, second half of the feed",
              slope <= a.rss_slope_bound,
              f"{slope:+.2f} MiB/min over {len(rss)} samples "
              f"({rss[0][1]:.1f} -> {rss[-1][1]:.1f} MiB; bound {a.rss_slope_bound} MiB/min)")
    else:
        check("RSS slope, second half of the feed", False, f"only {len(rss)} samples")

    # Posts stored against the ingest rate x retention, once the window is full.
    start = max(half, a.retention_secs + 2 * a.stats_interval_secs)
    steady = [r for r in feed if float(r["t_secs"]) >= start]
    if len(steady) >= 3:
        consumed = [(float(r["t_secs"]), num(r, "consumed")) for r in steady]
        rate = slope_per_minute(consumed) / 60.0
        expected = rate * a.retention_secs
        posts = [num(r, "posts") for r in steady]
        mean = sum(posts) / len(posts)
        ratio = mean / expected if expected > 0 else float("inf")
        check("posts stored vs ingest rate x retention",
              abs(ratio - 1) <= a.posts_tolerance,
              f"mean {mean:.0f} (min {min(posts):.0f}, max {max(posts):.0f}) over "
              f"{len(posts)} samples from t={start:.0f}s; expected {expected:.0f} "
              f"({rate:.0f} events/s applied x {a.retention_secs:.0f} s): ratio {ratio:.2f}, "
              f"bound 1 +- {a.posts_tolerance}")
    else:
        check("posts stored vs ingest rate x retention", False,
              f"only {len(steady)} samples after t={start:.0f}s: the feed must outlast the "
              f"retention by some samples")

    # Lag: the consumer keeps up.
    lags = [num(r, "lag") for r in second if num(r, "lag") is not None]
    if lags:
        bound = a.rate * a.lag_bound_secs
        check("Kafka lag, second half of the feed", max(lags) <= bound,
              f"max {max(lags):.0f} records (bound {bound:.0f}: {a.lag_bound_secs:.0f} s of feed)")
    else:
        check("Kafka lag, second half of the feed", False, "no lag samples")

    # File descriptors and threads do not grow.
    fds1 = [num(r, "fds") for r in first if num(r, "fds") is not None]
    fds2 = [num(r, "fds") for r in second if num(r, "fds") is not None]
    if fds1 and fds2:
        growth = max(fds2) - max(fds1)
        check("open fds, second half vs first half", growth <= a.fd_growth_bound,
              f"max {max(fds1):.0f} then {max(fds2):.0f} (growth bound {a.fd_growth_bound})")
    th = [num(r, "threads") for r in feed if num(r, "threads") is not None]
    if th:
        report("threads during the feed", f"min {min(th):.0f}, max {max(th):.0f}")
    if feed:
        last = feed[-1]
        report("store at the end of the feed",
               f"{last['posts']} posts, {last['authors']} authors, {last['tombstones']} "
               f"tombstones, arena reserved {float(last['arena_reserved_mib']):.1f} MiB, "
               f"timeline {float(last['timeline_mib']):.1f} MiB, RSS {last['rss_mib']} MiB")

    # Every answer of the query load.
    load = read_json(a.loadgen)
    if load is None:
        check("query load answers", False, f"no loadgen summary in {a.loadgen}")
    else:
        statuses = load.get("statuses", {})
        total = sum(statuses.values())
        non_ok = total - statuses.get("Ok", 0)
        check("query load: non-OK answers (client side)", total > 0 and non_ok == 0,
              f"{non_ok} of {total} ({statuses})")
        report("query load: degraded OK answers (client side)",
               f"{load.get('degraded', '?')} of {total}; latency OK {load.get('ok_latency_us')}")
    try:
        with open(a.server_statuses, encoding="utf-8") as f:
            server = json.load(f)
    except (OSError, ValueError):
        server = None
    if server is None:
        check("server: non-OK answers", False, f"no counts in {a.server_statuses}")
    else:
        bad = {k: v for k, v in server.items() if k != "ok" and v > 0}
        check("server: non-OK answers (get_in_network_posts_requests_total)", not bad,
              f"{sum(bad.values())} ({bad or 'none'}) of {sum(server.values())}")
    report("server: degraded answers (degrade level > 0)", str(a.server_degraded))

    # Answers equal to a fresh replica, then after a kill -9 and a restart from the snapshot.
    for name, path in (("fresh replica", a.replica), ("restart from the snapshot", a.restart)):
        c = read_json(path)
        if c is None:
            check(f"answers equal to the {name}" if name == "fresh replica"
                  else f"{name}: answers equal to the fresh replica",
                  False, f"no comparison in {path}")
            continue
        enough = c["nonempty"] * 4 >= c["shapes"] and c["posts_compared"] > 0
        ok = c["differing"] == 0 and c["not_comparable"] == 0 and enough
        check(f"answers equal to the {name}" if name == "fresh replica"
              else f"{name}: answers equal to the fresh replica", ok,
              f"{c['differing']} of {c['shapes']} shapes differ, {c['not_comparable']} without a full answer; "
              f"{c['nonempty']} non-empty (at least a quarter needed), "
              f"{c['posts_compared']} posts compared, asked again {c['degraded_retries']} times "
              f"for a degraded answer and {c.get('refused_retries', 0)} for a refusal")
    check("restart loaded the snapshot", a.snapshot_loaded_posts > 0,
          f"snapshot_loaded_posts {a.snapshot_loaded_posts}")

    failed = results.count(False)
    print(f"verdict: {'PASS' if failed == 0 else 'FAIL'} ({len(results) - failed} of "
          f"{len(results)} checks passed)")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
