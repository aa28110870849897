#!/usr/bin/env bash
# gpu-ab.sh — variants of sbn-bench side by side on one warm GPU (issue 13: every variant
# on the same machine, in one command, table last, full numbers in files).
#
#   scripts/gpu-ab.sh OUTDIR ROUNDS LABEL=BINARY... -- SBN-BENCH OPTIONS...
#
# Runs each BINARY (an sbn-bench built with the variant's -D flags, see
# bench/notes/gpu-run.md; or words split at spaces, such as "env SBN_KERNEL=unit
# build/prebuilt/bin/sbn-bench" for a variant the library picks at run time) with the
# same options, ROUNDS times, alternating
# (A B C A B C ...) so that drift of the machine falls on every variant alike; each run's
# JSON and log go to OUTDIR/LABEL.rN.{json,log}. The table (scripts/gpu_ab_table.py): per
# row, each variant's median over its rounds of the per-run medians, and its ratio to the
# first variant; OUTDIR.tar.gz holds the folder. Exit status: 1 if any run failed or had a
# wrong value.
set -u
if [ $# -lt 3 ]; then
  echo "usage: $0 OUTDIR ROUNDS LABEL=BINARY... -- SBN-BENCH OPTIONS..." >&2
  exit 2
fi
OUT=${1%/}
ROUNDS=$2
shift 2
case "$ROUNDS" in
  "" | *[!0-9]*) echo "gpu-ab: ROUNDS is a number, not '$ROUNDS'" >&2; exit 2 ;;
esac
labels=()
bins=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
  labels+=("${1%%=*}")
  bins+=("${1#*=}")
  shift
done
[ "${1:-}" = "--" ] && shift
[ ${#labels[@]} -gt 0 ] || { echo "gpu-ab: no LABEL=BINARY" >&2; exit 2; }
mkdir -p "$OUT" || exit 1
rc=0
for r in $(seq 1 "$ROUNDS"); do
  for i in "${!labels[@]}"; do
    l=${labels[$i]}
    echo "==> round $r: $l (${bins[$i]})"
    read -r -a cmd <<< "${bins[$i]}"
    "${cmd[@]}" --gpu on "$@" --json "$OUT/$l.r$r.json" > "$OUT/$l.r$r.log" 2>&1 || {
      echo "    FAILED (exit $?): $OUT/$l.r$r.log"
      rc=1
    }
    grep -E "^# (rows|copy bandwidth)" "$OUT/$l.r$r.log" | sed 's/^/    /'
  done
done
python3 "$(dirname "$0")/gpu_ab_table.py" "$OUT" "$ROUNDS" "${labels[@]}" > "$OUT/table.txt" || rc=1
cat "$OUT/table.txt"
# one file next to OUTDIR with all of it: the device tool brings back a limited number of
# files (the H100 run of 1110a5d, bench/results/2026-11-26-h100-1110a5d, lost the per-run
# JSON of a 6-run A/B to that limit)
tar -czf "$OUT.tar.gz" -C "$(dirname "$OUT")" "$(basename "$OUT")" || rc=1
exit $rc
