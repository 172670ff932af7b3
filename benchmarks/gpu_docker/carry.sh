#!/usr/bin/env bash
# On the GPU host: one part of pack.sh's tar into /tmp/stage (the machine keeps /tmp while it stays
# warm: issue the part calls back to back).   carry.sh NN
set -eu
mkdir -p /tmp/stage
cp ".carry/p$1/"carry.tar.xz.* /tmp/stage/
[ -f .carry/carry.sha256 ] && cp .carry/carry.sha256 /tmp/stage/
echo "part $1 staged: $(ls /tmp/stage | wc -l) files, $(du -sh /tmp/stage | cut -f1)"
