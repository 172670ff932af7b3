#!/usr/bin/env bash
# One A/A of the GPU cell against itself, as a user types it (one call, about 5-8 min):
#   aa.sh N [extra ab options]      e.g. aa.sh 1;  aa.sh 2;  aa.sh 3;  aa.sh 0 --no-restart-first (the bias, before)
# Fresh servers per run: started apart, the first restarted (the GPU defaults), 12 pairs of 3 s
# doubling while a metric is UNDECIDED, capped at 48 (96 pairs do not fit one 10-minute call).
set -u; . "$(dirname "$0")/env.sh"; N=$1; shift
T0=$(date +%s)
timeout 580 "$T" -m stackproof ab "$CELL" "$CELL" --python "$P" --max-pairs 48 --out "/tmp/aa$N" --json "$@" \
    > "$OUT/aa$N.json" 2> "/tmp/aa$N.stderr"
echo "aa $N: rc=$? in $(( $(date +%s) - T0 )) s"; tail -5 "/tmp/aa$N.stderr"
"$T" -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["verdict"], d["config"]["pairs"], "pairs", d["seconds"], "s");
[print(" ", m["name"], m["verdict"], m["change"], m["ci_low"], m["ci_high"]) for m in d["metrics"]]; print(" engines", d.get("engines"))' "$OUT/aa$N.json"
cp /tmp/aa"$N"/ab/*/ab.json "$OUT/aa$N.ab.json" 2>/dev/null; after
