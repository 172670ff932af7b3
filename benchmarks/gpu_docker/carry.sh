#!/usr/bin/env bash
# On the GPU host: one part of pack.sh's tar into /tmp/stage (the machine keeps /tmp while it stays
# warm: issue the part calls back to back).   carry.sh NN
set -eu
mkdir -p /tmp/stage
cp ".carry/p$1/"carry.tar.xz.* /tmp/stage/
[ -f .carry/carry.sha256 ] && cp .carry/carry.sha256 /tmp/stage/
# A wheel added to a list after the parts were packed travels beside them (setup.sh installs it too).
if [ -d .carry/extra ]; then mkdir -p /tmp/stage/extra && cp .carry/extra/*.whl /tmp/stage/extra/; fi
echo "part $1 staged: $(ls /tmp/stage | wc -l) files, $(du -sh /tmp/stage | cut -f1)"
