#!/bin/sh
# test_json_text.sh — sbn-bench's --json file is UTF-8 (what JSON readers require) whatever
# text goes into it, and a shape table's bytes are read as written:
# - a where text longer than its field (159 bytes) with a 2-byte character at the cut: cut
#   before that character, not inside it (Python's json.load failed on the file);
# - a --shapes path and an SBN_KERNEL value that are not UTF-8: each such byte U+FFFD;
# - a shape table with a NUL byte: refused, naming its line (the lines after it were
#   dropped unseen and the run exited 0);
# - a UTF-8 byte order mark: not part of the first id (--only S1 found no shape);
# - a comment line longer than a shape line may be: skipped (it was refused).
#   test_json_text.sh PYTHON SBN_BENCH DIR
py=$1
exe=$2
dir=$3/json_text
rm -rf "$dir"
mkdir -p "$dir" || exit 1
cd "$dir" || exit 1
fail=0
bad() {
  echo "test_json_text.sh: $*"
  fail=1
}
run="--gpu off --dtype fp32 --layout NCHW -i 1 --warmup 0"

# the where text: 158 ASCII bytes, then e-acute (2 bytes: the cut at 159 falls inside it)
"$py" -c 'import sys; sys.stdout.buffer.write(("A 4 8 4 4 " + "w" * 158 + "\u00e9\u20ac tail\n").encode())' >cut.tsv
# a path with the byte 0xff, and SBN_KERNEL=0xff
name=$(printf 'raw\377.tsv')
cp cut.tsv "$name"
# shellcheck disable=SC2086
SBN_KERNEL=$(printf '\377') "$exe" $run --shapes "$name" --json out.json >out.txt 2>&1 ||
  bad "the run on $name failed: $(cat out.txt)"
"$py" - out.json <<'EOF' || fail=1
import json, sys
try:
    d = json.load(open(sys.argv[1], encoding="utf-8"))  # strict: invalid UTF-8 raises
except ValueError as e:
    print(f"test_json_text.sh: {sys.argv[1]} is not UTF-8 JSON: {e}")
    sys.exit(1)
ok = True
where = d["rows"][0]["where"]
if where != "w" * 158:
    print(f"test_json_text.sh: where cut to {len(where.encode())} bytes ending {where[-3:]!r}: "
          "expected the 158 bytes before the character the cut falls in")
    ok = False
if d["shapes_source"] != "raw\ufffd.tsv" or d["sbn_kernel_env"] != "\ufffd":
    print(f"test_json_text.sh: shapes_source {d['shapes_source']!r}, sbn_kernel_env "
          f"{d['sbn_kernel_env']!r}: expected each non-UTF-8 byte as U+FFFD")
    ok = False
sys.exit(0 if ok else 1)
EOF

# a NUL byte on line 2: refused (exit 2), naming the line
printf 'A 4 8 4 4\nB 4 8 4 4\000junk\nC 4 8 4 4\n' >nul.tsv
# shellcheck disable=SC2086
"$exe" $run --shapes nul.tsv >nul.txt 2>&1
rc=$?
[ $rc -eq 2 ] && grep -q "line 2: a NUL byte" nul.txt ||
  bad "a shape table with a NUL byte: exit $rc, $(cat nul.txt)"

# a byte order mark before the first id, and a comment line of 600 characters
printf '\357\273\277S1 4 8 4 4\n#%0600d\nS2 4 8 4 4\n' 0 >bom.tsv
# shellcheck disable=SC2086
"$exe" $run --shapes bom.tsv --only S1,S2 >bom.txt 2>&1 ||
  bad "a table with a byte order mark and a long comment line: $(cat bom.txt)"
grep -q "rows 2 + latency 0" bom.txt || bad "a table with a byte order mark: not the rows of S1 and S2"
exit $fail
