#!/usr/bin/env bash
# On the GPU host after setup.sh: one or more jobs in one device call (servers die with the call).
#   run.sh JOB...    JOB: build | bf16 | bf16-warm | fp8 | stall | kill
# Every job uses the compile cache /tmp/cc (empty at the first start: the receipt says cold, then warm).
set -u
here=$(cd "$(dirname "$0")" && pwd); cd "$here/../.."
. "$here/dockerd.sh"; start_dockerd || exit 3
export PYTHONPATH=$PWD HF_HUB_OFFLINE=1 STACKPROOF_CACHE_DIR=/tmp/spcache STACKPROOF_GPU_ACCESS=${STACKPROOF_GPU_ACCESS:-auto}
export STACKPROOF_BASE_ARCHIVES=/tmp/archives STACKPROOF_MIRRORS=none
export STACKPROOF_PY_SPY=$(ls /tmp/carry/wheels/py_spy-*.whl)
T=/tmp/tools/bin/python
# The matrix with this host tree's sha256 (matrix.yaml holds zeros: a build from it is exit 2).
# nvcc's folder on this host (the image is this host's tree, so the same path there): vLLM 0.26.0 tunes
# FlashInfer only with nvcc on PATH (matrix.yaml, base gpu-host-tree).
nvcc_dir=$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")
echo "nvcc: $(command -v nvcc || echo 'not on PATH here')"
sed -e "s/0\{64\}/$(cat /tmp/archives/hostbase.tar.sha256)/" -e "s#:/usr/local/cuda/bin:#:$nvcc_dir:#" matrix.yaml > matrix.gpu.yaml
CELL=gpu-docker-vllm-0.26.0-tiny
mkdir -p /tmp/out
# RUN_UNTIL (epoch seconds): end every job early enough that the run directories still come back
# when the device call's time or the session's device budget is nearly spent.
limit() { local left=$(( ${RUN_UNTIL:-0} - $(date +%s) - 20 )); [ "${RUN_UNTIL:-0}" -gt 0 ] && [ $left -lt 580 ] && echo $(( left > 1 ? left : 1 )) || echo 580; }
for job in "$@"; do
    S=$(date +%s)
    case $job in
        build) timeout $(limit) $T -m stackproof build $CELL --matrix matrix.gpu.yaml > /tmp/out/build.log 2>&1; rc=$?
               tail -15 /tmp/out/build.log ;;
        bf16|bf16-warm|fp8)
            args=(run $CELL --matrix matrix.gpu.yaml --out /tmp/out/$job --compile-cache /tmp/cc --json)
            [ $job = fp8 ] && args+=(--arm fp8)
            timeout $(limit) $T -m stackproof "${args[@]}" > /tmp/out/$job.json 2> /tmp/out/$job.stderr; rc=$?
            tail -12 /tmp/out/$job.stderr ;;
        stall|kill)
            timeout $(limit) $T benchmarks/gpu_docker/faults.py $job --matrix matrix.gpu.yaml --out /tmp/out/$job \
                --compile-cache /tmp/cc > /tmp/out/$job.stdout 2> /tmp/out/$job.stderr; rc=$?
            tail -8 /tmp/out/$job.stderr; cat /tmp/out/$job.stdout ;;
        *) echo "unknown job $job"; rc=2 ;;
    esac
    echo "=== $job: rc=$rc in $(( $(date +%s) - S )) s; containers left: $(docker ps -aq | wc -l); GPU memory: $(nvidia-smi --query-gpu=memory.used --format=csv,noheader)"
done
# What comes back (8 files at most): the run directories, packed.
tar -C /tmp -czf "$OUT/out-$(echo "$@" | tr ' ' '-').tgz" out --exclude='*.safetensors' 2>/dev/null
ls -la "$OUT"
