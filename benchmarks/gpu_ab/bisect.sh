#!/usr/bin/env bash
# The bisect over the eight planted versions as a user types it (one call, about 7-9 min): the
# index served here on 127.0.0.1:8765 for the call; each version a layer over /tmp/venv (--python).
# Expected: FIRST BAD 5.0 after the bad end and halving (4 A/B runs); 6 pairs doubling to 12 per
# step (a 5 ms step delay costs about two thirds of tok/s: decided at the first look).
set -u; . "$(dirname "$0")/env.sh"
"$T" benchmarks/gpu_ab/planted.py --out /tmp/planted --serve > /tmp/planted.log 2>&1 &
INDEX=$!; trap 'kill $INDEX 2>/dev/null' EXIT; sleep 1
T0=$(date +%s)
timeout 560 "$T" -m stackproof bisect "$CELL" --matrix matrix.gpu-ab.yaml --python "$P" --package stackproof-planted \
    --good 1.0 --bad 8.0 --pairs 6 --max-pairs 12 --out /tmp/bisect --json > "$OUT/bisect.json" 2> /tmp/bisect.stderr
echo "bisect: rc=$? in $(( $(date +%s) - T0 )) s"; grep '^bisect' /tmp/bisect.stderr | tail -12
cp /tmp/bisect/bisect/*/bisect.json "$OUT/bisect.bisect.json" 2>/dev/null; after
