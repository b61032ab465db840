#!/usr/bin/env python3
"""Ratios of `tokenspeed bench --json` to the peer's JSON (bench/peers/hf_peer.py), both from one
device run: prints a markdown table of matching rows (prefill by prompt length, decode by batch x
context) with each side's figure, our % of ceiling, and us / peer."""
import json
import sys


def main(ours_path, peer_path):
    ours, peer = json.load(open(ours_path)), json.load(open(peer_path))
    def key(r):
        return (r.get("phase", ""), r.get("batch"), r.get("context"))
    prow = {key(r): r for r in peer["rows"] if "skipped" not in r}
    print(f"peer: {peer['peer']}")
    c = ours.get("ceilings", {})
    print(f"ceilings (same run): copy {c.get('copy_gb_s', 0):.0f} GB/s, GEMM {c.get('gemm_tflops', 0):.0f} TFLOP/s")
    print("| phase | batch | context | tokenspeed tok/s | % of ceiling | peer tok/s | ratio |")
    print("|---|---|---|---|---|---|---|")
    for r in ours.get("results", ours.get("rows", [])):
        if "skipped" in r or "tok_s" not in r:
            continue
        phase = r["phase"]  # "prefill" or "decode" (the decode-after-prefill rows have no peer twin)
        p = prow.get((phase, r.get("batch"), r.get("context")))
        pct = r.get("pct_copy", r.get("pct_gemm", 0))
        if p is None:
            continue
        print(f"| {phase} | {r.get('batch')} | {r.get('context')} | {r['tok_s']:.1f} | {pct:.1f}% | {p['tok_s']:.1f} | "
              f"{r['tok_s'] / p['tok_s']:.2f}x |")
    for p in peer["rows"]:
        if p.get("phase") == "cached_prefix":
            print(f"peer: {p['new_tokens']} new tokens after {p['context']} cached: {p['step_ms']:.2f} ms")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
