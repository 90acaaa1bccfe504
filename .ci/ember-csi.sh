#!/usr/bin/env bash
# Installs Ember-CSI (a real third-party CSI plugin, CSI v0.2.0 … v1.1.0) into a venv for
# slrp's interop tests (crates/slrp-supervisor/tests/ember.rs). Idempotent: does nothing
# when the venv already has it. Needs python3 with venv and network access to PyPI.
#
#   .ci/ember-csi.sh [VENV]      (default: $SLRP_EMBER_CSI_VENV or /opt/slrp-ci/ember-venv)
#
# Why the pins: ember-csi 0.9.1's generated protobuf modules predate protobuf 4, and
# Cinder's fake driver imports `fixtures` (see docs/csi-client.md, Interop).
set -euo pipefail

venv="${1:-${SLRP_EMBER_CSI_VENV:-/opt/slrp-ci/ember-venv}}"

if [ -x "$venv/bin/ember-csi" ] && "$venv/bin/python" -c 'import ember_csi' 2>/dev/null; then
  echo "ember-csi already installed in $venv"
  exit 0
fi

# shellcheck source=venv.sh
. "$(dirname "$0")/venv.sh"
make_venv "$venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check \
  'ember-csi==0.9.1' 'protobuf==3.20.3' fixtures
"$venv/bin/pip" check
# Warm the bytecode caches so the first plugin start in the tests is not the slow one.
"$venv/bin/python" -c 'import ember_csi.ember_csi' >/dev/null 2>&1 || true
echo "ember-csi installed in $venv"
