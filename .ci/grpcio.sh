#!/usr/bin/env bash
# Installs Python grpcio + grpcio-tools into a venv: a gRPC C-core client (the stack of
# Python, C++, Ruby, ... clients) for slrp-csi-local's interop test
# (crates/slrp-csi-local/tests/grpcio.rs). Idempotent: does nothing when the venv already
# has both. Needs python3 with venv and access to PyPI.
#
#   .ci/grpcio.sh [VENV]      (default: $SLRP_GRPCIO_VENV or /opt/slrp-ci/grpcio-venv)
#
# Why the pins: grpc C-core >= 1.57 sends a unix socket path as the HTTP/2 :authority,
# which is what the test exercises; 1.85.x is the release verified on this machine.
set -euo pipefail

venv="${1:-${SLRP_GRPCIO_VENV:-/opt/slrp-ci/grpcio-venv}}"

if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c 'import grpc, grpc_tools' 2>/dev/null; then
  echo "grpcio already installed in $venv"
  exit 0
fi

# shellcheck source=venv.sh
. "$(dirname "$0")/venv.sh"
make_venv "$venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check \
  'grpcio==1.85.*' 'grpcio-tools==1.85.*'
"$venv/bin/pip" check
"$venv/bin/python" -c 'import grpc, grpc_tools; print("grpcio", grpc.__version__)'
echo "grpcio installed in $venv"
