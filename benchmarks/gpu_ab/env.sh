# Sourced by the gpu_ab scripts: the environment under test, stackproof's own interpreter, the cell.
P=${PY:-/tmp/venv/bin/python}        # the cell's environment (--python)
T=${TOOLS:-/tmp/tools/bin/python}    # stackproof's own
CELL=h200-vllm-0.26.0-tiny
export PYTHONPATH=$PWD HF_HUB_OFFLINE=1 STACKPROOF_CACHE_DIR=/tmp/spcache
# One compile/JIT cache for every call while the machine stays warm: without one each vLLM start on the
# H100 spent about 105 s more in engine init (tests/fixtures/gpu-ab-interrupted/README.md).
export STACKPROOF_COMPILE_CACHE=${STACKPROOF_COMPILE_CACHE:-/tmp/compile-cache}
OUT=${OUT:-/tmp/gpu-ab-out}; mkdir -p "$OUT"
sp() { "$T" -m stackproof "$@"; }
# Every vLLM process group gone at the end of a call: counted, never killed by name here.
after() { echo "vLLM processes left: $(ps -eo args | grep -c '[v]llm' || true)"; nvidia-smi --query-gpu=memory.used --format=csv,noheader; }
