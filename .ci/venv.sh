# Sourced by the interop installers (.ci/ember-csi.sh, .ci/grpcio.sh).
#
#   make_venv DIR     creates a Python venv at DIR, installing python3-venv first when
#                     python3 lacks venv support (as root, through apt-get)
make_venv() {
  local venv="$1"
  if ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      apt-get update -qq
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
    else
      echo "python3 venv support is missing" >&2
      return 1
    fi
  fi
  mkdir -p "$(dirname "$venv")"
  python3 -m venv "$venv"
}
