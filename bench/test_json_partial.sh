#!/bin/sh
# test_json_partial.sh — sbn-bench's --json file is valid JSON from the plan on and after every
# row. A CPU-mode run is read while it runs: once its plan is on stderr the file must parse
# (before the first row has finished), every later read must parse; it is killed with SIGKILL
# once the file holds 3 rows; what it leaves must parse, say "complete": false, plan more rows
# than it holds, and hold finished rows (checked values, no error).
#   test_json_partial.sh PYTHON SBN_BENCH DIR
py=$1
exe=$2
dir=$3
f=$dir/partial.json
rm -f "$f" "$f".tmp*
"$exe" --gpu off --json "$f" >/dev/null 2>"$dir/partial.err" &
pid=$!
rows() { "$py" -c 'import json, sys; print(len(json.load(open(sys.argv[1]))["rows"]))' "$f"; }
i=0
while [ "$i" -lt 600 ] && ! grep -q 'plan:' "$dir/partial.err"; do # the plan is said
  sleep 0.05
  i=$((i + 1))
done
if ! n=$(rows); then
  echo "test_json_partial.sh: $f is not valid JSON once the plan is said (before any row)"
  kill -KILL "$pid" 2>/dev/null
  exit 1
fi
i=0
while [ "$i" -lt 1200 ]; do # 60 s at most
  if [ -s "$f" ]; then
    if ! n=$(rows); then
      echo "test_json_partial.sh: $f is not valid JSON while the run goes on"
      kill -KILL "$pid" 2>/dev/null
      exit 1
    fi
    [ "$n" -ge 3 ] && break
  fi
  sleep 0.05
  i=$((i + 1))
done
kill -KILL "$pid" 2>/dev/null
wait "$pid" 2>/dev/null
exec "$py" - "$f" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
rows = d["rows"]
problems = []
if d.get("schema") != 5: problems.append(f"schema {d.get('schema')}, expected 5")
if not isinstance(d.get("inference"), list): problems.append("no inference list")
# CPU mode: one inference row per main row (every shape x dtype x layout at W = 1)
if d.get("inference_planned") != d.get("rows_planned"):
    problems.append(f"inference_planned {d.get('inference_planned')} != rows_planned {d.get('rows_planned')}")
if d.get("complete") is not False: problems.append(f"complete is {d.get('complete')!r}, expected false")
if d.get("ok") is not False: problems.append(f"ok is {d.get('ok')!r}, expected false (incomplete)")
if len(rows) < 3: problems.append(f"{len(rows)} rows, expected >= 3")
if not d.get("rows_planned", 0) > len(rows): problems.append(f"rows_planned {d.get('rows_planned')} <= {len(rows)} rows")
for r in rows:
    if r["error"] is not None or r["checked"] <= 0 or r["us_fwd"] is None:
        problems.append(f"row {r['shape']} {r['dtype']} {r['layout']}: not a finished row")
print(f"partial JSON: {len(rows)} of {d.get('rows_planned')} rows, complete {d.get('complete')}")
for p in problems: print("test_json_partial.sh:", p)
sys.exit(1 if problems else 0)
PY
