#!/usr/bin/env python3
"""Issue 19's burst ratio within one run: reads the per-request JSON that `bench ablate` writes
for docs/bench/burst-alt.json (a long prompt alone every 30 s, two together 15 s later) and prints,
per pair, the later TTFT of the two over the TTFT of the single before it, raw and scaled by
prompt length (prefill time grows ~linearly plus attention's quadratic term: scaled by tokens^1.3,
the exponent fitted on this model's isolated runs, 2,600-2,750 tokens).
Usage: docs/bench/burst_cycles.py OUT/auto.json"""
import json
import statistics
import sys

reqs = sorted(json.load(open(sys.argv[1]))["requests"], key=lambda r: r["scheduled_s"])
singles = [r for r in reqs if r["class"] == "single" and not r["error"]]
pairs = {}
for r in reqs:
    if r["class"] != "single" and not r["error"]:
        pairs.setdefault(round(r["scheduled_s"]), []).append(r)
raw, scaled = [], []
for t, pair in sorted(pairs.items()):
    before = [s for s in singles if s["scheduled_s"] < t]
    if len(pair) != 2 or not before:
        continue
    s = before[-1]
    worst = max(p["ttft_s"] for p in pair)
    expect = sum((p["prompt_tokens"] / s["prompt_tokens"]) ** 1.3 for p in pair) * s["ttft_s"]
    raw.append(worst / s["ttft_s"])
    scaled.append(worst / expect * 2)
    print(f"pair at {t:4d} s: TTFT {[round(p['ttft_s'] * 1000) for p in pair]} ms, tokens "
          f"{[p['prompt_tokens'] for p in pair]}; single before: {s['ttft_s'] * 1000:.0f} ms, "
          f"{s['prompt_tokens']} tokens; later / single {raw[-1]:.3f}x, length-scaled {scaled[-1]:.3f}x")
if raw:
    print(f"median later / single: {statistics.median(raw):.3f}x (length-scaled {statistics.median(scaled):.3f}x), "
          f"{len(raw)} pairs")
