#!/usr/bin/env bash
# Here (where PyPI and a Debian mirror answer): everything the GPU host lacks, as parts small enough
# for one device call each (a call carries 64 MiB with the working tree).
#   bash benchmarks/gpu_docker/pack.sh [DOWNLOADS]      parts land in .carry/pNN/ (git-ignored)
# What is carried is the three lists beside this script, never a memory:
#   carry-server.txt  the vLLM 0.26.0 wheel set the image installs (cp312: the host's Python)
#   carry-tool.txt    stackproof's own runtime dependencies for the tool's venv there (uv left out:
#                     only `stackproof lock` runs it)
#   Docker 26 from Debian 13: dockerd, containerd, containerd-shim-runc-v2, runc, docker, and the
#                     buildx plugin (the cell Dockerfile's RUN --mount needs BuildKit)
# Wheels are re-zipped STORED before xz, which compresses the tar a third smaller than the wheels' own
# deflate (shared/reference/gpu-docker.md section 2).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd); repo=$(cd "$here/../.." && pwd)
dl=$(realpath -m "${1:-/tmp/gpu-docker-downloads}"); mkdir -p "$dl/wheels" "$dl/deps" "$dl/docker"
part_mib=${PART_MIB:-50}
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s]"; }

names() { awk '{print $NF}' "$1" | grep '\.whl$'; }
pins() { names "$1" | sed -E 's/^([^-]+)-([^-]+)-.*/\1==\2/; s/_/-/g'; }
plat=(--only-binary=:all: --no-deps --python-version 3.12 --implementation cp)
for p in manylinux_2_31 manylinux_2_28 manylinux_2_27 manylinux_2_26 manylinux_2_24 manylinux_2_17 manylinux2014 manylinux_2_5 manylinux1; do
    plat+=(--platform "${p}_x86_64")
done
for list in server tool; do
    dest=$dl/$([ $list = server ] && echo wheels || echo deps)
    missing=$(names "$here/carry-$list.txt" | while read -r w; do [ -f "$dest/$w" ] || echo "$w"; done)
    if [ -n "$missing" ]; then
        echo "$(el) downloading the $list set into $dest"
        pins "$here/carry-$list.txt" > "$dl/$list-reqs.txt"
        pip download -q "${plat[@]}" -d "$dest" -r "$dl/$list-reqs.txt"
    fi
    for w in $(names "$here/carry-$list.txt"); do
        [ -f "$dest/$w" ] || { echo "pack: $w of carry-$list.txt was not downloaded (a new file name? update the list)" >&2; exit 3; }
    done
done
if [ ! -f "$dl/docker/core.tar.xz" ]; then
    echo "$(el) Docker 26 binaries"
    (cd "$repo" && bash /work/shared/reference/gpu-docker/build/pack-docker.sh "$dl/docker" 2>/dev/null) \
        || { echo "pack: Docker's .debs could not be fetched: see shared/reference/gpu-docker/build/pack-docker.sh" >&2; exit 3; }
fi

stage=$(mktemp -d); trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/wheels" "$stage/deps" "$stage/docker"
echo "$(el) re-zipping $(names "$here/carry-server.txt" | wc -l) + $(names "$here/carry-tool.txt" | wc -l) wheels STORED"
python3 - "$dl" "$stage" "$here" <<'PY'
import sys, zipfile, pathlib
dl, stage, here = map(pathlib.Path, sys.argv[1:])
for listname, sub in (("carry-server.txt", "wheels"), ("carry-tool.txt", "deps")):
    for line in (here / listname).read_text().splitlines():
        name = line.split()[-1]
        src, dst = dl / sub / name, stage / sub / name
        with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
            for info in zin.infolist():
                data = zin.read(info)  # read before the header says STORED, or the CRC check fails
                info.compress_type = zipfile.ZIP_STORED
                zout.writestr(info, data)
PY
cp "$dl/docker/core.tar.xz" "$dl/docker/buildx.tar.xz" "$stage/docker/"
echo "$(el) tar | xz -3"
rm -rf "$repo/.carry"; mkdir -p "$repo/.carry"
tar -C "$stage" -cf - wheels deps docker | xz -3 -T2 > "$stage/carry.tar.xz"
split -b "${part_mib}M" -d -a 2 "$stage/carry.tar.xz" "$stage/carry.tar.xz."
n=0
for f in "$stage"/carry.tar.xz.??; do
    n=$((n + 1)); d=$(printf '%s/.carry/p%02d' "$repo" "$n"); mkdir -p "$d"; mv "$f" "$d/"
done
sha256sum "$stage/carry.tar.xz" | cut -d' ' -f1 > "$repo/.carry/carry.sha256"
echo "$(el) $n parts of at most ${part_mib} MiB in .carry/ ($(du -sh "$stage/carry.tar.xz" | cut -f1) in all); sha256 $(cat "$repo/.carry/carry.sha256")"
