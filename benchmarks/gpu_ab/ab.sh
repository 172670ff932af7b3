#!/usr/bin/env bash
# The known-direction A/B as a user types it (one call, about 4 min): the cell against its one-seq
# arm (--max-num-seqs 1) from matrix.gpu-ab.yaml (setup.sh wrote it). REGRESSION in output tok/s
# expected, at the first look (12 pairs): -81.8% on the H100 by hand (gpu-docker.md section 3).
set -u; . "$(dirname "$0")/env.sh"
T0=$(date +%s)
# AB_TIMEOUT: less than what is left of the session's device time, so that the script itself ends the
# command (SIGINT: stackproof stops its servers) and what it wrote still comes back under $OUT.
timeout -s INT -k 30 "${AB_TIMEOUT:-560}" "$T" -m stackproof ab "$CELL" "$CELL:one-seq" --matrix matrix.gpu-ab.yaml \
    --python "$P" --out /tmp/ab1 --json > "$OUT/ab-one-seq.json" 2> "$OUT/ab-one-seq.stderr"
echo "ab one-seq: rc=$? (1 = REGRESSION) in $(( $(date +%s) - T0 )) s"; tail -5 "$OUT/ab-one-seq.stderr"
cp /tmp/ab1/ab/*/ab.json "$OUT/ab-one-seq.ab.json" 2>/dev/null
# every pair's slices and each server's log, also when the run was interrupted (the fixture's shape)
tar -C /tmp -czf "$OUT/ab1.tgz" ab1 2>/dev/null; after
