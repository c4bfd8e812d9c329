#!/usr/bin/env bash
# Mutation testing of the Rust that acts: the executor (src/runtime/exec/) and the
# controller (src/runtime/controller/), with `cargo mutants` (crates.io; installed into
# ~/.cargo/bin when missing). Each mutant is built once and judged by the tests that
# exercise that code (the removal and controller scenarios against real etcd, the model's
# world, and `verify` on the shipped rules), through nextest.
#
#   bash scripts/mutants.sh                 # every mutant of exec/ and controller/
#   bash scripts/mutants.sh --file src/runtime/exec/removal.rs   # one file
#
# The report lands in mutants.out/ (caught.txt, missed.txt: the survivors to kill with a
# test or an invariant). It takes hours on 2 cores: run it on a quiet machine.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v cargo-mutants >/dev/null 2>&1; then
  cargo install --locked cargo-mutants
fi
source scripts/apt.sh
ensure_apt_packages etcd-server:etcd
files=(--file 'src/runtime/exec/**' --file 'src/runtime/controller/**')
if [[ $# -gt 0 ]]; then files=(); fi
exec cargo mutants --test-tool nextest "${files[@]}" "$@" -- \
  -E 'test(/^removal::/) | test(/^controller::/) | test(/^verify::/) | test(/world::/) | test(/exec::/) | test(/nodes::/)'
