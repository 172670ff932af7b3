#!/bin/sh
# Install one index's requirement file from exactly that index, and from nowhere else.
# Usage: pip-install.sh PYTHON INDEX REQUIREMENTS [pip options...]
# The index location (a URL that may carry credentials, or a local wheel directory) arrives as the
# BuildKit secret `index-INDEX`, one pip option per line, so it never lands in a layer or the log.
# `--isolated` makes pip ignore any pip.conf and PIP_* variables the base image may carry, which
# could otherwise add an extra index (dependency confusion).
set -eu
python=$1
index=$2
requirements=$3
shift 3
options=$(cat "/run/secrets/index-$index")
cert=""
if [ -f /run/secrets/cabundle ]; then
    cert="--cert=/run/secrets/cabundle"
fi
# shellcheck disable=SC2086  # one option per line, none contains spaces
exec "$python" -m pip install --isolated --disable-pip-version-check --no-cache-dir --no-deps \
    --root-user-action=ignore $cert $options "$@" -r "$requirements"
