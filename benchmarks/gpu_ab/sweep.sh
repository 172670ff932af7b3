#!/usr/bin/env bash
# The cell's throughput-latency curve as a user types it (one call, about 3 min), and its page:
# `stackproof report` finds sweep.json under the directory and draws the curve on the cell page.
set -u; . "$(dirname "$0")/env.sh"
T0=$(date +%s)
timeout 400 "$T" -m stackproof sweep "$CELL" --python "$P" --sweep concurrency=1,2,4,8,16,32,64,128,256 --slice 5 \
    --ttft-p99-limit 200ms --out /tmp/sweep --json > "$OUT/sweep.json" 2> /tmp/sweep.stderr
echo "sweep: rc=$? in $(( $(date +%s) - T0 )) s"; tail -3 /tmp/sweep.stderr
"$T" -m stackproof report --receipts /tmp/sweep --out /tmp/site > /tmp/report.log 2>&1; echo "report rc=$?"
cp /tmp/sweep/sweep/*/sweep.json "$OUT/sweep.sweep.json" 2>/dev/null
ls /tmp/site | head; tar -C /tmp -czf "$OUT/site.tgz" site 2>/dev/null; after
