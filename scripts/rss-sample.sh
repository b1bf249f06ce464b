#!/usr/bin/env bash
# Sample a command's resident set every 0.1 s, each sample labelled with the
# last phase it printed (DRIVELAB_PHASES, src/phases.rs): which phase holds a
# peak that no phase boundary shows. Linux only (/proc).
#
#   scripts/rss-sample.sh OUT -- drivelab-bench child growth 100000
#
# Writes OUT.samples ("unix-time rss-KiB last-phase-line" per line), and the
# command's OUT.stdout and OUT.stderr; then prints each phase's highest sample.
# A sample labelled X was taken after phase X ended: in the phase after it.
set -euo pipefail
if [ $# -lt 3 ] || [ "$2" != "--" ]; then
  echo "usage: $0 OUT -- COMMAND [ARGS...]" >&2
  exit 2
fi
out=$1
shift 2
: > "$out.samples"
DRIVELAB_PHASES=1 "$@" > "$out.stdout" 2> "$out.stderr" &
pid=$!
while kill -0 "$pid" 2>/dev/null; do
  rss=$(awk '/^VmRSS:/ {print $2}' "/proc/$pid/status" 2>/dev/null || true)
  phase=$(grep -a '^\[phase\]' "$out.stderr" 2>/dev/null | tail -n 1 || true)
  [ -n "$rss" ] && echo "$(date +%s.%N) $rss ${phase:-(before the first phase)}" >> "$out.samples"
  sleep 0.1
done
status=0
wait "$pid" || status=$?
echo "highest sample (MiB) while each phase was the last printed:"
awk '{ k = $0; sub(/^[^ ]+ [^ ]+ /, "", k); if ($2 > m[k]) m[k] = $2 }
     END { for (k in m) printf "%9.1f  %s\n", m[k] / 1024, k }' "$out.samples" | sort -rn
exit "$status"
