#!/usr/bin/env python3
"""purser against the stack's floor: the ratios and aims of issue #23, from the two runs
benches/gateway.sh makes (an instant mock at c = 1/16/64, and a 200 ms mock at c = 1024).

    aims.py INSTANT_CSV SLOW_CSV FSYNC_FILE [FSYNCS_PER_REQUEST]

Each figure is the median over rounds. The floor is `proxy-floor` (axum handing bodies to
reqwest and back, same runtime and allocator as purser, no policy, no ledger, no JSON).
`design-floor` is that floor plus only the money path DESIGN asks of every request (the
request's and the answer's JSON read, a budget reservation, the write-ahead rows fsynced
before the call, their completion after), built as purser is: each aim is judged for it
too, and one it misses is out of reach for a gateway of purser's shape on this machine.
"""
import csv
import statistics
import sys

TARGET, FLOOR, DESIGN = "purser", "proxy-floor", "design-floor"


def load(path):
    rows = list(csv.DictReader(open(path, encoding="utf-8"))) if path else []
    by = {}
    for r in rows:
        by.setdefault((r["target"], int(r["concurrency"])), []).append(r)
    return by


def med(by, target, conc, key):
    rs = by.get((target, conc), [])
    vals = [float(r[key]) for r in rs if r.get(key) not in (None, "")]
    return statistics.median(vals) if vals else None


def total(by, target, conc, key):
    return sum(int(r[key] or 0) for r in by.get((target, conc), []))


def fmt(x, nd=3):
    return "n/a" if x is None else f"{x:.{nd}f}"


def main() -> None:
    if len(sys.argv) < 4:
        sys.exit("usage: aims.py INSTANT_CSV SLOW_CSV FSYNC_FILE [FSYNCS_PER_REQUEST]")
    fast, slow = load(sys.argv[1]), load(sys.argv[2])
    fsync = dict(kv.split("=") for kv in open(sys.argv[3], encoding="utf-8").read().split())
    per_req = float(sys.argv[4]) if len(sys.argv) > 4 else 1.0
    f50 = float(fsync["fsync_p50_ms"]) * per_req
    f99 = float(fsync["fsync_p99_ms"]) * per_req
    out = [f"fsync of the ledger's filesystem: p50 {fsync['fsync_p50_ms']} ms, p99 "
           f"{fsync['fsync_p99_ms']} ms; the default durability needs {per_req:g} per request", ""]

    out.append(f"{TARGET} and {DESIGN} ÷ {FLOOR}, instant mock (median over rounds)")
    out.append("")
    out.append("| target | conc | req/s | req/s ÷ floor | CPU µs/req | CPU ÷ floor | p50 ms (floor) | p99 ms (floor) | PSS MB (floor) |")
    out.append("|---|---|---|---|---|---|---|---|---|")
    concs = sorted({c for (t, c) in fast if t == TARGET})
    for target in (TARGET, DESIGN):
        for c in concs:
            g = lambda t, k: med(fast, t, c, k)
            rps, frps = g(target, "rps"), g(FLOOR, "rps")
            cpu, fcpu = g(target, "cpu_us_per_req"), g(FLOOR, "cpu_us_per_req")
            ratio = lambda a, b: None if a is None or not b else a / b
            out.append(f"| {target} | {c} | {fmt(rps, 0)} | {fmt(ratio(rps, frps), 2)} | {fmt(cpu, 0)} | {fmt(ratio(cpu, fcpu), 2)} | "
                       f"{fmt(g(target, 'p50_ms'))} ({fmt(g(FLOOR, 'p50_ms'))}) | {fmt(g(target, 'p99_ms'))} ({fmt(g(FLOOR, 'p99_ms'))}) | "
                       f"{fmt(g(target, 'pss_mb'), 0)} ({fmt(g(FLOOR, 'pss_mb'), 0)}) |")
    out.append("")

    def aims_for(target):
        """Each aim as (name, value, limit, verdict) for `target`, against the floor."""
        aims = []

        def aim(name, value, limit, ok):
            aims.append((name, value, limit, "met" if ok else "MISSED" if ok is not None else "n/a"))

        def le(a, b):
            return None if a is None or b is None else a <= b

        cpu64, fcpu64 = med(fast, target, 64, "cpu_us_per_req"), med(fast, FLOOR, 64, "cpu_us_per_req")
        aim("CPU µs per request, c=64", fmt(cpu64, 0), f"≤ 1.5 × {fmt(fcpu64, 0)}", le(cpu64, fcpu64 and 1.5 * fcpu64))
        rps64, frps64 = med(fast, target, 64, "rps"), med(fast, FLOOR, 64, "rps")
        aim("req/s, c=64", fmt(rps64, 0), f"≥ 0.67 × {fmt(frps64, 0)}", le(frps64 and 0.67 * frps64, rps64))
        p50, fp50 = med(fast, target, 1, "p50_ms"), med(fast, FLOOR, 1, "p50_ms")
        aim("p50, c=1 (ms)", fmt(p50), f"≤ {fmt(fp50)} + {f50:.3f} + 0.10", le(p50, fp50 and fp50 + f50 + 0.10))
        p99, fp99 = med(fast, target, 1, "p99_ms"), med(fast, FLOOR, 1, "p99_ms")
        aim("p99, c=1 (ms)", fmt(p99), f"≤ {fmt(fp99)} + {f99:.3f} + 0.5", le(p99, fp99 and fp99 + f99 + 0.5))
        pss = max((v for v in (med(fast, target, c, "pss_mb") for c in concs) if v is not None), default=None)
        aim("PSS (MB), instant mock", fmt(pss, 0), "< 64", le(pss, 63.999))

        if slow:
            c = max(cc for (t, cc) in slow if t == target) if any(t == target for (t, _) in slow) else 1024
            reqs = total(slow, target, c, "requests")
            # `errors` counts non-2xx answers too (wrk's status errors), and 503s come fast:
            # only answers that were served count, for the share and for the throughput.
            bad = total(slow, target, c, "errors")
            served = None if not reqs else (reqs - bad) / reqs
            aim(f"share served, 200 ms mock, c={c}", fmt(served and served * 100, 2) + " %", "100 %", None if served is None else bad == 0)
            rps, drps = med(slow, target, c, "rps"), med(slow, "direct", c, "rps")
            rps = None if rps is None or served is None else rps * served
            thr = None if rps is None or not drps else rps / drps
            aim(f"throughput ÷ direct, c={c}", fmt(thr), "≥ 0.97", le(0.97, thr))
            p99, fp99, dp99 = med(slow, target, c, "p99_ms"), med(slow, FLOOR, c, "p99_ms"), med(slow, "direct", c, "p99_ms")
            added = None if p99 is None or dp99 is None else p99 - dp99
            fadded = None if fp99 is None or dp99 is None else fp99 - dp99
            aim(f"p99 added over direct, c={c} (ms)", fmt(added, 1), f"≤ {fmt(fadded, 1)} + 30", le(added, fadded and fadded + 30))
            cpu, fcpu = med(slow, target, c, "cpu_us_per_req"), med(slow, FLOOR, c, "cpu_us_per_req")
            aim(f"CPU µs per request, c={c}", fmt(cpu, 0), f"≤ 1.5 × {fmt(fcpu, 0)}", le(cpu, fcpu and 1.5 * fcpu))
            pss, fpss = med(slow, target, c, "pss_mb"), med(slow, FLOOR, c, "pss_mb")
            aim(f"PSS (MB), c={c}", fmt(pss, 0), f"≤ {fmt(fpss, 0)} + 16", le(pss, fpss and fpss + 16))
        return aims

    # The design floor does only the money path DESIGN asks of every request, built as
    # purser is: an aim it misses is out of reach for purser's shape, on this machine.
    mine, least = aims_for(TARGET), aims_for(DESIGN)
    out.append(f"Aims (issue #23), with purser's defaults, and for {DESIGN} (DESIGN's money path alone)")
    out.append("")
    out.append(f"| aim | {TARGET} | {DESIGN} | limit | {TARGET} | {DESIGN} |")
    out.append("|---|---|---|---|---|---|")
    for (name, value, limit, verdict), (_, dvalue, _, dverdict) in zip(mine, least):
        out.append(f"| {name} | {value} | {dvalue} | {limit} | {verdict} | {dverdict} |")
    print("\n".join(out))


if __name__ == "__main__":
    main()
