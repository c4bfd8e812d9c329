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
  "valgrind:valgrind" # the decision core's instruction counts (scripts/counts.sh)
)
# ---------------------------------------------------------------------------------------

# The installer (scripts/apt.sh) is shared with scripts/chart-tools.sh.
# shellcheck source=scripts/apt.sh
source scripts/apt.sh
ensure_apt_packages "${APT_PACKAGES[@]}"
# etcd-server's package enables a system etcd; the tests start their own etcd processes.
disable_services etcd.service

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

echo "==> cargo clippy --all-targets --features counts -- -D warnings"
cargo clippy --all-targets --features counts -- -D warnings

# The checked boundary (ARCHITECTURE.md): the rules language compiles alone, without the
# runtime feature, so none of its modules can use kube, k8s-openapi, tokio, axum, hyper,
# tonic, or the runtime and the command line.
echo "==> cargo check --lib --no-default-features (the rules language alone)"
cargo check --lib --no-default-features

# The shipped rules in their canonical layout, and their test suite (rules/tests/); the
# cargo tests run both too (tests/fmt.rs, tests/seeds.rs), this says it first and plainly.
echo "==> ichor-rules fmt --check rules/ && ichor-rules test"
cargo run -q -- fmt --check rules/ charts/ichor-rules/rules/
cargo run -q -- test rules/tests --rules rules/

# helm and kubernetes-validate (installed once into a cache folder), the chart's lint,
# rendering and schema checks; tests/chart.rs finds helm through ICHOR_HELM.
bash scripts/chart-tools.sh install
eval "$(bash scripts/chart-tools.sh env)"
# moto's S3 server for the backup tests (tests/backup.rs), from PyPI into a cached venv.
bash scripts/s3-tools.sh install
eval "$(bash scripts/s3-tools.sh env)"
bash scripts/chart-tools.sh check

if cargo nextest --version >/dev/null 2>&1; then
  echo "==> cargo nextest run"
  cargo nextest run
else
  echo "==> cargo test"
  cargo test
fi

# The decision core's speed, independent of the machine's load: instructions per decision
# (callgrind) against the budgets in benches/counts/budgets.txt (fails >10% over one).
echo "==> scripts/counts.sh (instructions per decision against their budgets)"
bash scripts/counts.sh

# The container image (a static binary in an OCI layout, no daemon): built, unpacked, and
# its entrypoint run from the unpacked root filesystem (--version, check of the embedded
# rules). ICHOR_SKIP_IMAGE=1 leaves it out of a local run.
if [[ "${ICHOR_SKIP_IMAGE:-}" != 1 ]]; then
  echo "==> scripts/image.sh build && scripts/image.sh smoke"
  bash scripts/image.sh build
  bash scripts/image.sh smoke
  # Issue 36's memory bound on the binary the image ships: `serve` taking an encrypted
  # snapshot of a 100 MiB etcd into the S3 store stays under 64 MiB resident at its peak.
  echo "==> the shipped binary's peak memory while it snapshots a 100 MiB etcd"
  target_dir="${CARGO_TARGET_DIR:-target}"
  [[ "$target_dir" == /* ]] || target_dir="$PWD/$target_dir"
  export ICHOR_RELEASE_BIN="$target_dir/$(rustc -vV | sed -n 's/^host: //p')/release/ichor-rules"
  # verify's default suite on the same binary: the tests run bounded slices of it; the
  # whole suite (about 22 M states, 2-4 minutes on 2 cores) is what docs/rules.md states.
  echo "==> ichor-rules verify rules/ (the default suite, on the shipped binary)"
  "$ICHOR_RELEASE_BIN" verify rules/ | tail -n 12
  memory_test=release_serve_snapshots_a_100_mib_etcd_under_64_mib_peak
  if cargo nextest --version >/dev/null 2>&1; then
    cargo nextest run --run-ignored only -E "test(/$memory_test/)"
  else
    cargo test --test it -- --ignored "$memory_test"
  fi
fi
