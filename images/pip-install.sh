#!/bin/sh
# Install one index's requirement file from exactly that index, and from nowhere else.
# Usage: pip-install.sh PYTHON INDEX REQUIREMENTS [pip options...]
# The index location (a URL that may carry credentials, or a local wheel directory) arrives as the
# BuildKit secret `index-INDEX`: a requirements file of pip options, read by pip itself
# with `-r`, so the location is never in pip's argv (`ps`), a layer or the log.
# `--isolated` makes pip ignore any pip.conf and PIP_* variables the base image may carry, which
# could otherwise add an extra index (dependency confusion).
set -eu
python=$1
index=$2
requirements=$3
shift 3
secrets=${STACKPROOF_SECRETS_DIR:-/run/secrets}
cert=""
if [ -f "$secrets/cabundle" ]; then
    cert="--cert=$secrets/cabundle"
fi
# shellcheck disable=SC2086  # $cert is empty or one option without spaces
exec "$python" -m pip install --isolated --disable-pip-version-check --no-cache-dir --no-deps \
    --root-user-action=ignore $cert "$@" -r "$secrets/index-$index" -r "$requirements"
