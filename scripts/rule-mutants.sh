#!/usr/bin/env bash
# Which weakenings of the shipped rules does `verify` refute? Each `rule` statement of
# rules/*.rules is deleted in turn (a copy of rules/ in a scratch folder) and `verify` runs
# on the copy; the table says, per rule, whether verify refuted the deletion (exit 1, with
# the invariants violated), verified it anyway (exit 0: the rule is defence in depth, or
# the model misses what it guards), or could not tell (exit 2).
#
#   bash scripts/rule-mutants.sh                  # the default suite (minutes per rule)
#   bash scripts/rule-mutants.sh --max-control-planes 3 --max-failures 1 --max-workers 0
#
# Arguments are passed to `verify`. Needs a release build (`cargo build --release`).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=target/release/ichor-rules
[[ -x $bin ]] || cargo build --release -q
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
printf '| file | rule | verify | violated |\n|---|---|---|---|\n'
for file in rules/*.rules; do
  for rule in $(sed -n 's/^rule \([a-z0-9-]*\).*/\1/p' "$file"); do
    rm -rf "$scratch/rules" && mkdir -p "$scratch/rules" && cp rules/*.rules "$scratch/rules/"
    # Delete the statement: from its `rule` line up to the next blank line.
    awk -v r="rule $rule" '
      $0 == r || index($0, r " ") == 1 { skip = 1 }
      skip && /^$/ { skip = 0; next }
      !skip { print }
    ' "$file" > "$scratch/rules/$(basename "$file")"
    set +e
    out=$("$bin" verify "$scratch/rules" --format json "$@" 2>/dev/null)
    code=$?
    set -e
    case $code in
      0) verdict="verified" ;;
      1) verdict="refuted" ;;
      *) verdict="exit $code" ;;
    esac
    violated=$(printf '%s' "$out" | python3 -c '
import json, sys
try:
    d = json.load(sys.stdin)
    print(", ".join(sorted({v["invariant"] for v in d.get("violations", [])})))
except Exception:
    print("")
')
    printf '| %s | %s | %s | %s |\n' "$(basename "$file")" "$rule" "$verdict" "$violated"
  done
done
