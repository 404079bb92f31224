#!/usr/bin/env python3
"""Tests of scripts/soak_verdict.py on made-up soak results: a healthy soak passes, and each
kind of failure the soak exists to catch fails its check. Run: python3 scripts/soak_verdict_test.py
"""

import contextlib
import io
import json
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import soak_verdict  # noqa: E402

FEED = 150
RETENTION = 60
RATE = 1000


def samples(rss_per_min=0.0, posts_factor=1.0, lag=50, fd_jump=0):
    """Samples every 5 s of a 150 s feed at RATE events/s, then two after it."""
    rows = ["t_secs,phase,rss_mib,threads,fds,posts,authors,tombstones,"
            "arena_reserved_mib,timeline_mib,lag,consumed"]
    for t in range(0, FEED + 1, 5):
        filled = min(t, RETENTION)
        rss = 60 + filled * 0.5 + max(0, t - RETENTION) * rss_per_min / 60
        posts = int(RATE * filled * (posts_factor if t >= RETENTION else 1))
        fds = 40 + (fd_jump if t > FEED / 2 else 0)
        rows.append(f"{t},feed,{rss:.1f},20,{fds},{posts},9000,500,40.0,8.0,{lag},{RATE * t}")
    for t in (FEED + 5, FEED + 10):
        rows.append(f"{t},after,200.0,20,40,{RATE * RETENTION},9000,500,40.0,8.0,0,{RATE * FEED}")
    return "\n".join(rows) + "\n"


class Verdict(unittest.TestCase):
    def run_verdict(self, csv_text=None, statuses=None, load=None, replica=None, restart=None,
                    loaded=1000):
        with tempfile.TemporaryDirectory() as d:
            def put(name, text):
                path = os.path.join(d, name)
                with open(path, "w", encoding="utf-8") as f:
                    f.write(text)
                return path

            compare = {"shapes": 350, "nonempty": 300, "posts_compared": 50000,
                       "differing": 0, "not_comparable": 0, "degraded_retries": 0}
            args = [
                "--csv", put("samples.csv", csv_text or samples()),
                "--feed-secs", str(FEED), "--retention-secs", str(RETENTION),
                "--rate", str(RATE), "--rss-slope-bound", "4", "--posts-tolerance", "0.10",
                "--lag-bound-secs", "30", "--fd-growth-bound", "16",
                "--loadgen", put("loadgen.log", "3000 viewers\nrequests 3000\n" + json.dumps(
                    load or {"statuses": {"Ok": 3000}, "degraded": 2}) + "\n"),
                "--server-statuses", put("statuses.json", json.dumps(statuses or {"ok": 3000})),
                "--server-degraded", "2",
                "--replica", put("replica.json", json.dumps(replica or compare)),
                "--restart", put("restart.json", json.dumps(restart or compare)),
                "--snapshot-loaded-posts", str(loaded),
            ]
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                code = soak_verdict.main(args)
        return code, out.getvalue()

    def failed_checks(self, output):
        return [line for line in output.splitlines() if line.startswith("FAIL")]

    def test_a_healthy_soak_passes(self):
        code, out = self.run_verdict()
        self.assertEqual(code, 0, out)
        self.assertIn("verdict: PASS", out)
        self.assertIn("degraded OK answers (client side): 2 of 3000", out)

    def test_growing_memory_fails(self):
        code, out = self.run_verdict(samples(rss_per_min=10))
        self.assertEqual(code, 1)
        self.assertEqual(len(self.failed_checks(out)), 1, out)
        self.assertIn("RSS slope", self.failed_checks(out)[0])

    def test_a_store_holding_more_than_the_retention_fails(self):
        code, out = self.run_verdict(samples(posts_factor=1.3))
        self.assertEqual(code, 1)
        self.assertEqual(len(self.failed_checks(out)), 1, out)
        self.assertIn("posts stored", self.failed_checks(out)[0])

    def test_lag_and_leaked_fds_fail(self):
        code, out = self.run_verdict(samples(lag=RATE * 60, fd_jump=100))
        self.assertEqual(code, 1)
        failed = " ".join(self.failed_checks(out))
        self.assertIn("Kafka lag", failed)
        self.assertIn("open fds", failed)

    def test_a_non_ok_answer_fails(self):
        code, out = self.run_verdict(load={"statuses": {"Ok": 2999, "Unavailable": 1}})
        self.assertEqual(code, 1)
        self.assertIn("non-OK answers (client side)", self.failed_checks(out)[0])
        code, out = self.run_verdict(statuses={"ok": 2999, "resource_exhausted": 1})
        self.assertEqual(code, 1)
        self.assertIn("server: non-OK", self.failed_checks(out)[0])

    def test_differing_or_empty_comparisons_fail(self):
        differ = {"shapes": 350, "nonempty": 300, "posts_compared": 50000, "differing": 3,
                  "not_comparable": 0, "degraded_retries": 0}
        code, out = self.run_verdict(replica=differ)
        self.assertEqual(code, 1)
        self.assertIn("fresh replica", self.failed_checks(out)[0])
        empty = dict(differ, differing=0, nonempty=10, posts_compared=40)
        code, out = self.run_verdict(restart=empty)
        self.assertEqual(code, 1)
        self.assertIn("restart from the snapshot", self.failed_checks(out)[0])

    def test_a_restart_without_the_snapshot_fails(self):
        code, out = self.run_verdict(loaded=0)
        self.assertEqual(code, 1)
        self.assertIn("loaded the snapshot", self.failed_checks(out)[0])


if __name__ == "__main__":
    unittest.main()
