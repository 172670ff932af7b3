#!/usr/bin/env bash
# The load client against `vllm bench serve` on one server of the cell's settings (one call, about
# 5 min), concurrency 1 to 256, then the client's own ceiling against the instant fake server.
# CLIENT_CONCURRENCY (default 8,64,256,1: the issue's three first, each row is printed as it ends) and
# CEILING=0 (no fake-server ceiling) fit it to a short budget; SERVER_ARGS adds to the server's flags
# (--enforce-eager: ready in about 20 s instead of 113-150 s cold, a slower engine step, the same for both clients).
set -u; . "$(dirname "$0")/env.sh"
# Its own process group (setsid), ended by that group's id: the API server and its EngineCore together.
setsid /tmp/venv/bin/vllm serve /models/tiny-llama --served-model-name /models/tiny-llama --max-model-len 512 \
    --gpu-memory-utilization 0.3 --port 8000 ${SERVER_ARGS:-} > /tmp/client-server.log 2>&1 &
SERVER=$!; trap 'kill -- -$SERVER 2>/dev/null; sleep 5' EXIT
for _ in $(seq 240); do curl -sf http://127.0.0.1:8000/health > /dev/null && break; sleep 1; done
curl -sf http://127.0.0.1:8000/health > /dev/null || { tail -20 /tmp/client-server.log; exit 3; }
echo "server ready after ${SECONDS}s"; grep -m2 -E "KV cache|GPU KV" /tmp/client-server.log; nvidia-smi -L
timeout 420 "$T" benchmarks/gpu_ab/client_vs_bench.py --url http://127.0.0.1:8000 --bench /tmp/venv/bin/vllm \
    --model /models/tiny-llama --concurrency "${CLIENT_CONCURRENCY:-8,64,256,1}" --out "$OUT/client" 2> "$OUT/client.stderr" | tee "$OUT/client.txt"
[ "${CEILING:-1}" = 0 ] || timeout 120 "$T" benchmarks/client_ceiling.py --concurrency 8,64,256 --repeats 2 --duration 8 --json | tee "$OUT/ceiling.txt"
after
