#!/usr/bin/env bash
# Explorer figures for issue 6: schedules per minute against the correct
# driver, and the median time to first detection of each mutant over SEEDS
# explorer seeds (detect-only: no shrinking). Wall-clock figures: they report,
# nothing asserts on them.
set -euo pipefail
BIN=${BIN:-target/debug/drivelab}
BASE=${BASE:-scenarios/explore/cosi-lifecycle.yaml}
SEEDS=${SEEDS:-10}
BUDGET=${BUDGET:-60s}
out=$("$BIN" explore "$BASE" --cases 100000 --time-budget 60s --seed 1 --out-dir /tmp/drivelab-bench-explore || true)
echo "$out" | head -1
echo "$out" | python3 -c 'import re,sys; m=re.search(r"explored (\d+) schedules in ([\d.]+)s", sys.stdin.read()); print(f"schedules/min (correct driver): {60*int(m.group(1))/float(m.group(2)):.0f}")'
printf '| mutant | median first detection (s) | found in |\n|---|---|---|\n'
for m in $("$BIN" list mutants | awk '{print $1}'); do
  times=()
  for s in $(seq 1 "$SEEDS"); do
    t=$("$BIN" explore "$BASE" --mutant "$m" --seed "$s" --cases 1000 --time-budget "$BUDGET" --detect-only --out-dir /tmp/drivelab-bench-explore 2>/dev/null | sed -n 's/^FOUND after \([0-9.]*\)s.*/\1/p' || true)
    times+=("${t:-none}")
  done
  printf '%s\n' "${times[@]}" | python3 -c "
import sys, statistics
v=[l.strip() for l in sys.stdin if l.strip()]
f=[float(x) for x in v if x!='none']
med=f'{statistics.median(f):.1f}' if f else '-'
print(f'| $m | {med} | {len(f)}/{len(v)} seeds |')"
done
