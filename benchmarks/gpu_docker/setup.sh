#!/usr/bin/env bash
# On the GPU host, once, after the last carry.sh part: unpack, start Docker 26 with a CDI spec for
# the GPU, make stackproof's own venv, generate the tiny model, and write the host's own tree as the
# air-gapped base archive (with its sha256) that the GPU docker cell builds on.
set -u
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s]"; }
here=$(cd "$(dirname "$0")" && pwd)
. "$here/dockerd.sh"
if [ -f /tmp/stage/carry.sha256 ]; then
    got=$(cat /tmp/stage/carry.tar.xz.* | sha256sum | cut -d' ' -f1)
    [ "$got" = "$(cat /tmp/stage/carry.sha256)" ] || { echo "carried parts are incomplete or damaged: $got"; ls -la /tmp/stage; exit 3; }
fi
mkdir -p /tmp/carry && cat /tmp/stage/carry.tar.xz.* | xz -d | tar -C /tmp/carry -xf - || exit 3
echo "$(el) unpacked: $(ls /tmp/carry/wheels | wc -l) server wheels, $(ls /tmp/carry/deps | wc -l) tool wheels"
mkdir -p $D /root/.docker
tar -C $D -xJf /tmp/carry/docker/core.tar.xz && tar -C /root/.docker -xJf /tmp/carry/docker/buildx.tar.xz || exit 3
start_dockerd || exit 3
docker buildx version
# CDI: every NVIDIA device node, and the driver folder mounted read-only (section 1 of gpu-docker.md).
mkdir -p /etc/cdi
{ echo 'cdiVersion: "0.6.0"'; echo 'kind: nvidia.com/gpu'; echo 'devices:'; echo '  - name: all'; echo '    containerEdits:'; echo '      deviceNodes:'
  for n in /dev/nvidia* /dev/nvidia-caps/*; do [ -c "$n" ] && echo "        - path: $n"; done
  echo 'containerEdits:'; echo '  env:'; echo '    - LD_LIBRARY_PATH=/usr/local/nvidia/lib64:/usr/local/nvidia/lib'
  echo '  mounts:'; echo '    - hostPath: /usr/local/nvidia'; echo '      containerPath: /usr/local/nvidia'; echo '      options: ["ro", "nosuid", "nodev", "rbind"]'; } > /etc/cdi/nvidia.yaml
echo "$(el) CDI spec: $(grep -c 'path: /dev' /etc/cdi/nvidia.yaml) device nodes"
# stackproof's own venv: its runtime dependencies only (carry-tool.txt), nothing of the host's.
[ -d /tmp/stage/extra ] && cp /tmp/stage/extra/*.whl /tmp/carry/deps/
for w in $(awk '{print $NF}' "$here/carry-tool.txt"); do
    [ -f "/tmp/carry/deps/$w" ] || { echo "carry-tool.txt names $w, which was not carried (pack.sh again, or .carry/extra)"; exit 3; }
done
python3 -m venv /tmp/tools && /tmp/tools/bin/python -m pip install -q --no-index --no-deps --no-cache-dir /tmp/carry/deps/*.whl \
    > /tmp/pip-tools.log 2>&1 || { tail -20 /tmp/pip-tools.log; exit 3; }
PYTHONPATH=$PWD /tmp/tools/bin/python -m stackproof --help > /dev/null || exit 3
echo "$(el) tool venv ready"
# The server's wheels into the host's venv, which is the base (HANDOFF: the cell has no install step;
# the tiny model is generated in the build by the base's own python).
python3 -m pip install -q --no-index --no-deps --no-cache-dir /tmp/carry/wheels/*.whl > /tmp/pip-server.log 2>&1 \
    || { tail -20 /tmp/pip-server.log; exit 3; }
python3 -c 'import vllm, torch, transformers; print("vllm", vllm.__version__, "torch", torch.__version__, "transformers", transformers.__version__)' 2>&1 | tail -1
echo "$(el) server wheels in $(python3 -c 'import sys; print(sys.prefix)')"
# The base: the host's own /usr, /etc, /opt/torch as a rootfs archive (the driver folder stays out:
# the CDI spec mounts it). Its sha256 pins it in the content tag like any other input.
mkdir -p /tmp/archives
# One read of the tree: the tar is hashed as it is written (a second pass over 16 GB cost 16 s).
tar -C / --exclude=usr/local/nvidia -cf - usr etc opt/torch bin lib lib64 sbin 2>/tmp/tar.err \
    | tee /tmp/archives/hostbase.tar | sha256sum | cut -d' ' -f1 > /tmp/archives/hostbase.tar.sha256
echo "$(el) hostbase.tar: $(du -sh /tmp/archives/hostbase.tar | cut -f1) (tar rc $?, $(wc -l < /tmp/tar.err) warnings)"
echo "$(el) sha256 $(cat /tmp/archives/hostbase.tar.sha256)"
nvidia-smi -L; df -h /tmp | tail -1
/tmp/tools/bin/python verify/probes/doctor_probe.py > "$OUT/doctor-probe.json" 2>/dev/null || true
echo "$(el) setup done"
