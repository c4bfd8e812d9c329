#!/usr/bin/env bash
# Writes the timing table of ARCHITECTURE.md ("Why a flat program") from criterion's own
# output, so its figures are what the benches measured, never typed by hand:
#
#   cargo bench --bench decide -- decide/ && bash scripts/bench-table.sh
#
# Reads the medians of <target>/criterion/decide/<bench>/new/estimates.json (the last run;
# CRITERION_DIR=<dir> reads another criterion folder) and replaces the table between
# `<!-- bench:decide:begin -->` and `<!-- bench:decide:end -->`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
target_dir=${CARGO_TARGET_DIR:-$(cargo metadata --format-version 1 --no-deps |
  sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')}
dir="${CRITERION_DIR:-$target_dir/criterion}/decide"

median() { # nanoseconds, one decimal
  local f="$dir/$1/new/estimates.json"
  [[ -f "$f" ]] || {
    echo "error: no $f; run: cargo bench --bench decide -- decide/" >&2
    exit 1
  }
  python3 -c 'import json,sys; print("%.1f" % json.load(open(sys.argv[1]))["median"]["point_estimate"])' "$f"
}
ratio() { python3 -c 'import sys; print("%.1fx" % (float(sys.argv[2]) / float(sys.argv[1])))' "$1" "$2"; }

a=$(median hot_allow)
r=$(median hot_refuse)
as=$(median hot_allow_stack_machine)
rs=$(median hot_refuse_stack_machine)
ta=$(median two_approve_allow)
tr=$(median two_approve_refuse)
ra=$(median two_remove_allow)
rr=$(median two_remove_refuse)
table="| decision | flat | stack machine only | ratio |
|---|---|---|---|
| shipped rules, allowed (5 approved, count 3) | $a ns | $as ns | $(ratio "$a" "$as") |
| shipped rules, refused (3 approved, count 3) | $r ns | $rs ns | $(ratio "$r" "$rs") |
| two-rule file: approve allowed / refused | $ta / $tr ns | | |
| two-rule file: remove allowed / refused | $ra / $rr ns | | |"
tmp=$(mktemp)
awk -v table="$table" '
  /<!-- bench:decide:begin -->/ { print; print table; skip = 1; next }
  /<!-- bench:decide:end -->/ { skip = 0 }
  !skip { print }
' ARCHITECTURE.md >"$tmp" && mv "$tmp" ARCHITECTURE.md
echo "==> ARCHITECTURE.md: the decide/ medians of the last run ($(date -u +%F))"
