#!/usr/bin/env bash
# The decision core's guard, independent of the machine's load: callgrind counts the
# instructions of one decision (a new session and one event, as `cargo bench --bench decide
# -- decide/` times it) for each case of benches/counts/main.rs (the shipped rules' hot
# allow and refuse, flat and on the stack machine, and the two-rule file's four), and
# compares them with the budgets committed in benches/counts/budgets.txt. A count more than
# 10% over its budget fails (exit 1).
#
#   bash scripts/counts.sh            # compare (CI: scripts/test.sh)
#   bash scripts/counts.sh --update   # write the counts as the new budgets, and the table
#                                     # of ARCHITECTURE.md (commit both, saying why)
#
# What it catches, shown on a deliberately slowed decision (not committed): with
# `compile::flat::VALUES` at 256 instead of 64 (four times the value array every session
# zeroes) the two-rule cases come out 17-20% over their budgets and this exits 1; the
# shipped rules' cases, whose decisions do more, 1-4% over.
#
# Needs valgrind (scripts/test.sh installs it). Builds the language alone in release
# (`--features counts --no-default-features`): about a minute on 2 cores from nothing.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

BUDGETS=benches/counts/budgets.txt
N=${ICHOR_COUNTS_N:-2000}
TOLERANCE=10 # percent over budget that fails

update=""
[[ "${1:-}" == "--update" ]] && update=yes

echo "==> cargo build --release --no-default-features --features counts --bin decide-counts"
cargo build -q --release --no-default-features --features counts --bin decide-counts
target_dir=$(cargo metadata --format-version 1 --no-deps |
  sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
bin="$target_dir/release/decide-counts"

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

declare -A budget=()
if [[ -f "$BUDGETS" ]]; then
  while read -r name count _; do
    [[ -z "$name" || "$name" == \#* ]] && continue
    budget[$name]=$count
  done <"$BUDGETS"
fi

failed=0
lines=()
printf '%-22s %10s %10s %8s\n' case "instr/dec" budget change
for case in $("$bin" list); do
  valgrind --tool=callgrind --callgrind-out-file="$out/$case" --collect-atstart=no \
    '--toggle-collect=*decide_counts::measured*' "$bin" "$case" "$N" >/dev/null 2>"$out/$case.log" || {
    cat "$out/$case.log" >&2
    echo "error: $case failed under valgrind" >&2
    exit 2
  }
  total=$(sed -n 's/^totals: *\([0-9]*\).*/\1/p' "$out/$case")
  [[ -n "$total" ]] || total=$(sed -n 's/^summary: *\([0-9]*\).*/\1/p' "$out/$case")
  count=$(((total + N / 2) / N))
  lines+=("$case $count")
  b=${budget[$case]:-}
  if [[ -z "$b" ]]; then
    printf '%-22s %10d %10s %8s\n' "$case" "$count" "-" "new"
    [[ -z "$update" ]] && failed=1
    continue
  fi
  change=$(((count - b) * 1000 / b))
  sign=+
  ((change < 0)) && sign=- && change=$((-change))
  printf '%-22s %10d %10d %7s\n' "$case" "$count" "$b" "$sign$((change / 10)).$((change % 10))%"
  if ((count * 100 > b * (100 + TOLERANCE))); then
    echo "    $case: $count instructions per decision, more than ${TOLERANCE}% over its budget of $b" >&2
    failed=1
  fi
done

if [[ -n "$update" ]]; then
  {
    echo "# Instructions per decision (callgrind; scripts/counts.sh), the budgets CI compares"
    echo "# with: a count more than ${TOLERANCE}% over its budget fails. Written by"
    echo "# \`bash scripts/counts.sh --update\`; commit a change saying why it grew."
    printf '%s\n' "${lines[@]}"
  } >"$BUDGETS"
  # The table in ARCHITECTURE.md, between its markers.
  table=$(for l in "${lines[@]}"; do printf '| `%s` | %s |\n' "${l% *}" "${l#* }"; done)
  awk -v table="$table" '
    /<!-- counts:begin -->/ { print; print "| case | instructions per decision |"; print "|---|---|"; print table; skip = 1; next }
    /<!-- counts:end -->/ { skip = 0 }
    !skip { print }
  ' ARCHITECTURE.md >"$out/arch" && cp "$out/arch" ARCHITECTURE.md
  echo "==> wrote $BUDGETS and the table of ARCHITECTURE.md"
  exit 0
fi

if ((failed)); then
  cat >&2 <<MSG
error: the decision core got slower (instructions per decision, above).
  Find what grew: valgrind --tool=callgrind --collect-atstart=no \\
    '--toggle-collect=*decide_counts::measured*' $bin <case> 1000; callgrind_annotate --auto=yes
  If the growth is deliberate (a new rule in rules/, a feature worth its cost), update the
  budgets on purpose: bash scripts/counts.sh --update, and commit $BUDGETS and
  ARCHITECTURE.md with a message that says why the decision costs more.
MSG
  exit 1
fi
echo "==> instruction counts within ${TOLERANCE}% of their budgets"
