#!/usr/bin/env bash
# stackproof verify of the H200 cell on the host runtime; files back under $OUT.
#   verify.sh ARM STAGES [stall]    e.g. verify.sh default all; verify.sh fp8 imports,startup
set -u
ARM=$1 STAGES=$2 MODE=${3:-}
P=${PY:-/tmp/venv/bin/python}  # the environment under test
T=${TOOLS:-/tmp/tools/bin/python}  # stackproof's own
export PYTHONPATH=$PWD HF_HUB_OFFLINE=1 STACKPROOF_CACHE_DIR=/tmp/spcache STACKPROOF_PY_SPY=${PYSPY:-/tmp/venv/bin/py-spy}
OUTDIR=/tmp/out-$ARM${MODE:+-$MODE}
ARGS=(verify ${CELL:-h200-vllm-0.26.0-tiny} --runtime host --python "$P" --out "$OUTDIR" --json)
[ "$ARM" != default ] && ARGS+=(--arm "$ARM")
[ "$STAGES" != all ] && ARGS+=(--stages "$STAGES")
SITE=$($P -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
if [ "$MODE" = stall ]; then
  cp tests/recipes/stall/stackproof_test_stall.py tests/recipes/stall/stackproof-test-stall.pth "$SITE/"
  ARGS+=(--questions 400 --stall-seconds 20)
  ( # the flag once the load is under way: the startup's one completion, then load requests
    for _ in $(seq 600); do
      n=$(find "$OUTDIR" -name server.log -exec cat {} + 2>/dev/null | grep -c 'POST /v1/' || true)
      [ "${n:-0}" -ge 20 ] && break; sleep 0.5
    done
    touch /tmp/stackproof-stall; echo "stall flag set after $n requests" >&2
    sleep 90; rm -f /tmp/stackproof-stall
  ) &
fi
T0=$(date +%s)
timeout 570 "$T" -m stackproof "${ARGS[@]}" > "$OUT/verify-$ARM${MODE:+-$MODE}.json" 2> "$OUTDIR.stderr"
echo "verify $ARM $STAGES $MODE: rc=$? in $(( $(date +%s) - T0 )) s"
rm -f /tmp/stackproof-stall "$SITE/stackproof_test_stall.py" "$SITE/stackproof-test-stall.pth"
tail -25 "$OUTDIR.stderr"
find "$OUTDIR" -type f | head -50
ps -eo pid,pgid,args | grep -c '[v]llm' || true
tar -C /tmp -czf "$OUT/run-$ARM${MODE:+-$MODE}.tgz" "$(basename "$OUTDIR")" "$(basename "$OUTDIR").stderr"
