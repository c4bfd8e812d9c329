#!/usr/bin/env bash
# An S3-compatible server for the backup tests (issue 36): moto's server, from PyPI, installed
# once into a venv in a cache folder shared by every checkout. The tests start it on
# 127.0.0.1 themselves and need no network at test time.
#
#   bash scripts/s3-tools.sh install   # install what is missing, print nothing else
#   bash scripts/s3-tools.sh env       # print `export ICHOR_MOTO_SERVER=...`
#
# The cache folder is $ICHOR_TOOLS_DIR/../s3-tools when set, else ~/.cache/ichor-rules/s3-tools.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

MOTO_VERSION="5.1.22"

tools_dir() {
  if [[ -n "${ICHOR_S3_TOOLS_DIR:-}" ]]; then
    echo "$ICHOR_S3_TOOLS_DIR"
  elif [[ -n "${HOME:-}" ]]; then
    echo "$HOME/.cache/ichor-rules/s3-tools"
  else
    echo "$PWD/target/s3-tools"
  fi
}
DIR="$(tools_dir)"
MOTO="$DIR/venv/bin/moto_server"

moto_ok() {
  [[ -x "$MOTO" && "$(cat "$DIR/venv/ichor.version" 2>/dev/null)" == "$MOTO_VERSION" ]]
}

install() {
  moto_ok && return 0
  # shellcheck source=scripts/apt.sh
  source scripts/apt.sh
  ensure_apt_packages \
    "python3:python3" \
    "python3-venv:python3 -c 'import ensurepip, venv'"
  mkdir -p "$DIR"
  exec 9>"$DIR/.lock"
  flock 9
  if ! moto_ok; then
    echo "==> installing moto[server] $MOTO_VERSION into $DIR/venv" >&2
    rm -rf "$DIR/venv"
    python3 -m venv "$DIR/venv"
    "$DIR/venv/bin/pip" install --quiet --disable-pip-version-check "moto[server]==$MOTO_VERSION"
    echo "$MOTO_VERSION" >"$DIR/venv/ichor.version"
  fi
  exec 9>&-
}

case "${1:-install}" in
  install) install ;;
  env) echo "export ICHOR_MOTO_SERVER=$(printf %q "$MOTO")" ;;
  *) echo "usage: $0 [install|env]" >&2; exit 2 ;;
esac
