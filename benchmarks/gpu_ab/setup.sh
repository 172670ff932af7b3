#!/usr/bin/env bash
# On the GPU host, once, after the last `benchmarks/gpu_docker/carry.sh NN` part (the same staging):
# the server's wheels into a venv over the host's torch (/tmp/venv: the environment under test, as
# benchmarks/h200_host/setup.sh makes it), stackproof's own venv with uv (/tmp/tools), the tiny
# Llama at the cell's /models/tiny-llama, the planted index and matrix.gpu-ab.yaml (planted.py).
set -u
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s]"; }
if [ -f /tmp/stage/carry.sha256 ]; then
    got=$(cat /tmp/stage/carry.tar.xz.* | sha256sum | cut -d' ' -f1)
    [ "$got" = "$(cat /tmp/stage/carry.sha256)" ] || { echo "carried parts incomplete or damaged: $got"; exit 3; }
fi
mkdir -p /tmp/carry && cat /tmp/stage/carry.tar.xz.* | xz -d | tar -C /tmp/carry -xf - || exit 3
echo "$(el) unpacked: $(ls /tmp/carry/wheels | wc -l) server wheels, $(ls /tmp/carry/deps | wc -l) tool wheels"
python3 -m venv --system-site-packages /tmp/venv
SITE=$(/tmp/venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
python3 -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))' > "$SITE/host-torch.pth"
/tmp/venv/bin/python -m pip install -q --no-index --no-deps --no-cache-dir /tmp/carry/wheels/*.whl > /tmp/pip.log 2>&1 \
    || { tail -20 /tmp/pip.log; exit 3; }
python3 -m venv /tmp/tools && /tmp/tools/bin/python -m pip install -q --no-index --no-deps --no-cache-dir /tmp/carry/deps/*.whl \
    > /tmp/pip-tools.log 2>&1 || { tail -20 /tmp/pip-tools.log; exit 3; }
# A wheel that travelled beside the parts (carry.sh stages .carry/extra: uv, when the parts are
# benchmarks/gpu_docker's packing, which leaves uv out) goes into the tool's venv too.
if ls /tmp/stage/extra/*.whl > /dev/null 2>&1; then
    /tmp/tools/bin/python -m pip install -q --no-index --no-deps --no-cache-dir /tmp/stage/extra/*.whl || exit 3
fi
PYTHONPATH=$PWD /tmp/tools/bin/python -c 'import stackproof.cli, uv; print("stackproof and uv", uv.find_uv_bin())' || exit 3
/tmp/venv/bin/python -c 'import vllm, torch; print("vllm", vllm.__version__, "torch", torch.__version__, torch.cuda.get_device_name(0))'
mkdir -p /models
[ -f /models/tiny-llama/config.json ] || HF_HUB_OFFLINE=1 /tmp/venv/bin/python images/recipes/tiny-model/make_tiny_model.py \
    /models/tiny-llama > /tmp/tiny.log 2>&1 || { tail -20 /tmp/tiny.log; exit 3; }
# NO_PLANTED=1: a call that measures only the client (client.sh) skips the bisect's planted index.
[ -n "${NO_PLANTED:-}" ] || /tmp/tools/bin/python benchmarks/gpu_ab/planted.py --out /tmp/planted || exit 3
nvidia-smi -L; nproc; echo "$(el) setup done"
