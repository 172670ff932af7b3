#!/usr/bin/env bash
# The cell's throughput-latency curve as a user types it (one call, about 3 min), and its page:
# `stackproof report` finds sweep.json under the directory and draws the curve on the cell page.
set -u; . "$(dirname "$0")/env.sh"
T0=$(date +%s)
timeout 400 "$T" -m stackproof sweep "$CELL" --python "$P" --sweep concurrency=1,2,4,8,16,32,64,128,256 --slice 5 \
    --ttft-p99-limit 200ms --out /tmp/sweep --json > "$OUT/sweep.json" 2> /tmp/sweep.stderr
echo "sweep: rc=$? in $(( $(date +%s) - T0 )) s"; tail -3 /tmp/sweep.stderr
# The cell page needs a receipt of the cell: the H200 verify's (tests/fixtures), beside the sweep.
mkdir -p /tmp/site-in && cp -r tests/fixtures/h200-vllm-0.26.0/receipts/pass-bf16 /tmp/sweep /tmp/site-in/
"$T" -m stackproof report --receipts /tmp/site-in --out /tmp/site > /tmp/report.log 2>&1; echo "report rc=$?"
grep -l "sweep" /tmp/site/*.html /tmp/site/*/*.html 2>/dev/null | head
cp /tmp/sweep/sweep/*/sweep.json "$OUT/sweep.sweep.json" 2>/dev/null
ls /tmp/site | head; tar -C /tmp -czf "$OUT/site.tgz" site 2>/dev/null; after
