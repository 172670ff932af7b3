#!/usr/bin/env bash
# Here (where the package index answers): what the GPU host lacks for issue 45, as parts of at most
# 50 MiB for one device call each (a call carries 64 MiB with the working tree).
#   bash benchmarks/gpu_ab/pack.sh [DOWNLOADS]        parts land in .carry/pNN/ (git-ignored)
# The wheel lists are benchmarks/gpu_docker's (carry-server.txt: vLLM 0.26.0's set for the host's
# cp312; carry-tool.txt: stackproof's runtime dependencies), plus uv: `bisect` builds each version's
# layer with it (pipeline/host/layer.py). No docker: every run here is on the host runtime.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd); repo=$(cd "$here/../.." && pwd); lists=$repo/benchmarks/gpu_docker
dl=$(realpath -m "${1:-/tmp/gpu-ab-downloads}"); mkdir -p "$dl/wheels" "$dl/deps"
UV_VERSION=${UV_VERSION:-0.13.9}
names() { awk '{print $NF}' "$1" | grep '\.whl$'; }
pins() { names "$1" | sed -E 's/^([^-]+)-([^-]+)-.*/\1==\2/; s/_/-/g'; }
plat=(--only-binary=:all: --no-deps --python-version 3.12 --implementation cp)
for p in manylinux_2_34 manylinux_2_31 manylinux_2_28 manylinux_2_17 manylinux2014 manylinux_2_5 manylinux1; do
    plat+=(--platform "${p}_x86_64")
done
pins "$lists/carry-server.txt" > "$dl/server-reqs.txt"
{ pins "$lists/carry-tool.txt"; echo "uv==$UV_VERSION"; } > "$dl/tool-reqs.txt"
pip download -q "${plat[@]}" -d "$dl/wheels" -r "$dl/server-reqs.txt"
pip download -q "${plat[@]}" -d "$dl/deps" -r "$dl/tool-reqs.txt"
for w in $(names "$lists/carry-server.txt"); do [ -f "$dl/wheels/$w" ] || { echo "pack: $w missing" >&2; exit 3; }; done
stage=$(mktemp -d); trap 'rm -rf "$stage"' EXIT
tar -C "$dl" -cf - wheels deps | xz -3 -T2 > "$stage/carry.tar.xz"
split -b "${PART_MIB:-50}M" -d -a 2 "$stage/carry.tar.xz" "$stage/carry.tar.xz."
rm -rf "$repo/.carry"; mkdir -p "$repo/.carry"; n=0
for f in "$stage"/carry.tar.xz.??; do n=$((n + 1)); d=$(printf '%s/.carry/p%02d' "$repo" "$n"); mkdir -p "$d"; mv "$f" "$d/"; done
sha256sum "$stage/carry.tar.xz" | cut -d' ' -f1 > "$repo/.carry/carry.sha256"
echo "$n parts in .carry/ ($(du -sh "$stage/carry.tar.xz" | cut -f1)); on the GPU host: carry.sh 01 .. $(printf %02d $n), then setup.sh"
