#!/usr/bin/env bash
# One part of the wheel tar into /tmp/stage (the machine keeps /tmp while it stays warm).
set -eu
mkdir -p /tmp/stage
cp ".whl/p$1/"carry.tar.* /tmp/stage/
ls -la /tmp/stage | tail -n +2
