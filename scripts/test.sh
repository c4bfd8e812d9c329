#!/usr/bin/env bash
# The whole test suite: system packages (installed only when missing), formatting, lints,
# and the tests. Works on a fresh Debian machine with Rust installed; run it as root there
# (or as a user with sudo) so missing packages can be installed.
#
#   bash scripts/test.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# ---------------------------------------------------------------------------------------
# System packages the build and the tests need, as "package:command". The command is what
# proves the package is present (`command -v`); with no command, `dpkg -s package` decides.
# A package is installed only when it is missing, and `apt-get update` runs only then.
#
# Later work adds its needs here, e.g.:
#   "etcd-server:etcd"              # an etcd for the controller's integration tests
#   "protobuf-compiler:protoc"      # for crates that compile .proto files
APT_PACKAGES=(
  "gcc:cc"           # the linker rustc calls (absent when Rust came from rustup alone)
  "libc6-dev"        # crt files and libc for linking
  "etcd-server:etcd" # a real etcd for the Talos API stand-ins (tests/talos.rs)
)
# ---------------------------------------------------------------------------------------

missing=()
for entry in "${APT_PACKAGES[@]}"; do
  pkg="${entry%%:*}"
  cmd=""
  [[ "$entry" == *:* ]] && cmd="${entry#*:}"
  if [[ -n "$cmd" ]]; then
    command -v "$cmd" >/dev/null 2>&1 && continue
  elif ! command -v dpkg >/dev/null 2>&1 || dpkg -s "$pkg" >/dev/null 2>&1; then
    continue
  fi
  missing+=("$pkg")
done

if ((${#missing[@]} > 0)); then
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "error: missing packages (${missing[*]}) and no apt-get to install them" >&2
    exit 1
  fi
  sudo=()
  if [[ "$(id -u)" -ne 0 ]]; then
    if command -v sudo >/dev/null 2>&1; then
      sudo=(sudo)
    else
      echo "error: missing packages (${missing[*]}); run as root to install them" >&2
      exit 1
    fi
  fi
  echo "==> installing ${missing[*]}"
  "${sudo[@]}" apt-get update
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y --no-install-recommends "${missing[@]}"
fi

# rustfmt and clippy are rustup components; a minimal toolchain lacks them.
# (rustup installs `cargo fmt`/`cargo clippy` proxies either way, so ask them to run.)
for component in rustfmt clippy; do
  sub="${component/rustfmt/fmt}"
  if ! cargo "$sub" --version >/dev/null 2>&1 && command -v rustup >/dev/null 2>&1; then
    echo "==> rustup component add $component"
    rustup component add "$component"
  fi
done

echo "==> cargo fmt --check"
cargo fmt --check

echo "==> cargo clippy --all-targets -- -D warnings"
cargo clippy --all-targets -- -D warnings

if cargo nextest --version >/dev/null 2>&1; then
  echo "==> cargo nextest run"
  cargo nextest run
else
  echo "==> cargo test"
  cargo test
fi
