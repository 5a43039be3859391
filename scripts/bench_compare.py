#!/usr/bin/env python3
"""Our figures in two benchmark runs, side by side: before and after a change.

    scripts/bench_compare.py BEFORE_DIR AFTER_DIR

Each directory holds a run's results as `scripts/bench.sh` writes them
(`bench/results/`, or an archived copy under `bench/results/archive/`):
handover.json, failover.json, api_load.json, idle.json, adapter.json. Prints
a markdown table of kube-runtime-lease's own figures (the references' are in
each run's summary): the handover after a release and the failover after a
SIGKILL (median and p99 of signal → new leader), the requests per follower
per minute (within about ±0.1–1/min: the run's summary states the
resolution), the idle CPU and memory of a leader and a follower, and the
adapter's added time per item and overhead (interleaved A/B medians). The
ratio is after / before.
"""

import json
import statistics
import sys
from pathlib import Path

OURS = "kube-runtime-lease"


def load(d: Path, name: str):
    p = d / name
    return json.loads(p.read_text()) if p.exists() else []


def pct(values, q):
    values = sorted(values)
    if not values:
        return None
    k = max(0, min(len(values) - 1, round(q * (len(values) - 1))))
    return values[k]


def trials(d: Path, scenario: str):
    out = {}
    for r in load(d, f"{scenario}.json"):
        if r["implementation"] == OURS and r.get("error") is None and r.get("signal_to_leader_ms") is not None:
            out.setdefault(r["timing"], []).append(r["signal_to_leader_ms"])
    return out


def rows(d: Path):
    """(metric, unit, value) for one run."""
    out = {}
    for scenario, label in (("handover", "handover, SIGTERM → leader"), ("failover", "failover, SIGKILL → leader")):
        for timing, v in trials(d, scenario).items():
            out[(f"{label} ({timing}), median", "ms")] = statistics.median(v)
            out[(f"{label} ({timing}), p99", "ms")] = pct(v, 0.99)
    # A follower's requests: the total with N candidates less the total with
    # the leader alone, over the N - 1 followers (as the run's summary counts).
    load_rows = [r for r in load(d, "api_load.json") if r["implementation"] == OURS]
    alone = {r["timing"]: sum(r["per_minute"].values()) for r in load_rows if r["candidates"] == 1}
    for r in load_rows:
        if r["candidates"] > 1 and r["timing"] in alone:
            per_follower = (sum(r["per_minute"].values()) - alone[r["timing"]]) / (r["candidates"] - 1)
            out[(f"requests per follower, {r['candidates']} candidates ({r['timing']})", "/min")] = per_follower
    for r in load(d, "idle.json"):
        if r["implementation"] == OURS:
            minutes = r["seconds"] / 60
            out[(f"idle {r['role']} CPU ({r['timing']})", "ms/min")] = r["sched_cpu_ms"] / minutes
            out[(f"idle {r['role']} RSS ({r['timing']})", "MiB")] = r["rss_kib"] / 1024
    for r in load(d, "adapter.json"):
        out[(f"adapter, added per item ({r['stream']})", "ns")] = r["ab_wrapped_ns_per_item"] - r["ab_bare_ns_per_item"]
        out[(f"adapter overhead ({r['stream']}), A/B median", "%")] = r["ab_overhead_pct_median"]
    return out


def fmt(v):
    if v is None:
        return "–"
    return f"{v:.1f}" if abs(v) < 1000 else f"{v:.0f}"


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    before, after = rows(Path(sys.argv[1])), rows(Path(sys.argv[2]))
    print("| figure | unit | before | after | after / before |")
    print("|---|---|---|---|---|")
    for key in list(before) + [k for k in after if k not in before]:
        b, a = before.get(key), after.get(key)
        ratio = (
            f"{a / b:.2f}"
            if a is not None and b is not None and abs(b) > 1 and key[1] not in ("%", "/min")
            else "–"
        )
        print(f"| {key[0]} | {key[1]} | {fmt(b)} | {fmt(a)} | {ratio} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
