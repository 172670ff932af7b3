# Rendered by stackproof 0.1.0 from cell sm120-vllm-0.28.0-fi-0.6.18.post1-cu130: do not edit, edit matrix.yaml.
# Build with BuildKit (RUN --mount, secrets); the index locations and the CA bundle arrive as
# secrets and never land in a layer.
FROM vllm/vllm-openai:v0.28.0

# Overrides from index `flashinfer`, --no-deps: flashinfer-cubin==0.6.18.post1
RUN --mount=type=bind,source=stackproof/pip-install.sh,target=/tmp/stackproof/pip-install.sh \
    --mount=type=bind,source=stackproof/requirements/overrides-flashinfer.txt,target=/tmp/stackproof/requirements/overrides-flashinfer.txt \
    --mount=type=bind,source=stackproof/wheels/flashinfer,target=/tmp/stackproof/wheels/flashinfer \
    --mount=type=secret,id=index-flashinfer \
    --mount=type=secret,id=cabundle \
    sh /tmp/stackproof/pip-install.sh python3 flashinfer /tmp/stackproof/requirements/overrides-flashinfer.txt

# Overrides from index `flashinfer-cu130`, --no-deps: flashinfer-jit-cache==0.6.18.post1+cu130
RUN --mount=type=bind,source=stackproof/pip-install.sh,target=/tmp/stackproof/pip-install.sh \
    --mount=type=bind,source=stackproof/requirements/overrides-flashinfer-cu130.txt,target=/tmp/stackproof/requirements/overrides-flashinfer-cu130.txt \
    --mount=type=bind,source=stackproof/wheels/flashinfer-cu130,target=/tmp/stackproof/wheels/flashinfer-cu130 \
    --mount=type=secret,id=index-flashinfer-cu130 \
    --mount=type=secret,id=cabundle \
    sh /tmp/stackproof/pip-install.sh python3 flashinfer-cu130 /tmp/stackproof/requirements/overrides-flashinfer-cu130.txt

# Overrides from index `pypi`, --no-deps: flashinfer-python==0.6.18.post1
RUN --mount=type=bind,source=stackproof/pip-install.sh,target=/tmp/stackproof/pip-install.sh \
    --mount=type=bind,source=stackproof/requirements/overrides-pypi.txt,target=/tmp/stackproof/requirements/overrides-pypi.txt \
    --mount=type=bind,source=stackproof/wheels/pypi,target=/tmp/stackproof/wheels/pypi \
    --mount=type=secret,id=index-pypi \
    --mount=type=secret,id=cabundle \
    sh /tmp/stackproof/pip-install.sh python3 pypi /tmp/stackproof/requirements/overrides-pypi.txt

LABEL \
    org.opencontainers.image.title="sm120-vllm-0.28.0-fi-0.6.18.post1-cu130" \
    org.opencontainers.image.description="stackproof cell sm120-vllm-0.28.0-fi-0.6.18.post1-cu130" \
    org.opencontainers.image.base.name="vllm/vllm-openai:v0.28.0" \
    org.opencontainers.image.vendor="stackproof" \
    io.stackproof.cell="sm120-vllm-0.28.0-fi-0.6.18.post1-cu130" \
    io.stackproof.arch="sm120" \
    io.stackproof.platform="linux/amd64" \
    io.stackproof.overrides="[{\"name\":\"flashinfer-cubin\",\"version\":\"0.6.18.post1\",\"index\":\"flashinfer\"},{\"name\":\"flashinfer-jit-cache\",\"version\":\"0.6.18.post1+cu130\",\"index\":\"flashinfer-cu130\"},{\"name\":\"flashinfer-python\",\"version\":\"0.6.18.post1\",\"index\":\"pypi\"}]" \
    io.stackproof.tool-version="0.1.0"
