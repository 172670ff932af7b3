#!/usr/bin/env bash
# Join the parts, install the wheels into a venv over the host's torch, make the tiny model.
# The parts hold wheels/ (the server's set) and deps/ (stackproof's own dependencies, cp312).
set -eu
T0=$(date +%s); el() { echo "$(( $(date +%s) - T0 )) s"; }
cat /tmp/stage/carry.tar.* | tar -C /tmp -xf -
echo "unpacked $(ls /tmp/wheels | wc -l) wheels at $(el)"
python3 -m venv --system-site-packages /tmp/venv
# That host's python3 is itself a venv (/opt/torch/.venv): a venv made from it sees the base
# interpreter's site, not its torch. One .pth line puts the host's torch (and its neighbours) in.
SITE=$(/tmp/venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
python3 -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))' > "$SITE/host-torch.pth"
/tmp/venv/bin/python -m pip install -q --no-index --no-deps --no-cache-dir /tmp/wheels/*.whl > /tmp/pip.log 2>&1 \
  || { tail -20 /tmp/pip.log; exit 1; }
echo "installed at $(el)"
# stackproof itself runs from its own venv (its declared dependencies, nothing of the host's), so the
# environment under test holds the host's torch and the carried wheels only.
python3 -m venv /tmp/tools
/tmp/tools/bin/python -m pip install -q --no-index --no-cache-dir --find-links /tmp/deps /tmp/deps/*.whl > /tmp/pip-tools.log 2>&1 \
  || { tail -20 /tmp/pip-tools.log; exit 1; }
echo "tools installed at $(el)"
/tmp/venv/bin/python -c 'import vllm, torch; print("vllm", vllm.__version__, "torch", torch.__version__, torch.cuda.get_device_name(0))'
mkdir -p /models
HF_HUB_OFFLINE=1 /tmp/venv/bin/python images/recipes/tiny-model/make_tiny_model.py /models/tiny-llama > /tmp/tiny.log 2>&1 \
  || { tail -20 /tmp/tiny.log; exit 1; }
echo "model at $(el)"
/tmp/venv/bin/python verify/probes/doctor_probe.py > "$OUT/doctor-probe.json" 2> /tmp/doctor-probe.err || tail -5 /tmp/doctor-probe.err
PYTHONPATH=$PWD /tmp/tools/bin/python -c 'import stackproof.cli, stackproof.runjob, verify.stages.runner, verify.runtime.host, verify.load.stats, verify.load.run; print("stackproof imports")'
cat /proc/sys/kernel/yama/ptrace_scope 2>/dev/null || echo "no yama ptrace_scope"
ulimit -n
echo "setup done at $(el)"
