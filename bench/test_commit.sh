#!/bin/sh
# test_commit.sh CMAKE GIT SCRIPT — bench/commit.cmake, which sbn-bench's build runs every
# time: the header names the commit of the tree as it is at that build (a new commit, an
# edit: -dirty), "unknown" outside a git checkout of its own, and is not rewritten when
# its text is the same (so nothing recompiles).
set -eu
cmake=$1 git=$2 script=$3
tmp=$(mktemp -d "${TMPDIR:-/tmp}/test_commit.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail=0
gen() { "$cmake" -DSRC="$1" -DGIT="$git" -DOUT="$tmp/h.h" -P "$script"; sed -n 's/^#define SBN_BENCH_COMMIT "\(.*\)"$/\1/p' "$tmp/h.h"; }
expect() { # what got want
  if [ "$2" != "$3" ]; then echo "FAILED: $1: '$2', expected '$3'"; fail=1; else echo "ok   $1: '$2'"; fi
}
mkdir "$tmp/repo" "$tmp/plain"
cd "$tmp/repo"
"$git" init -q . && "$git" config user.email t@t && "$git" config user.name t
echo a > f && "$git" add f && "$git" commit -q -m one
expect "a commit" "$(gen "$tmp/repo")" "$("$git" rev-parse --short HEAD)"
stamp=$(stat -c %Y.%s "$tmp/h.h"); sleep 1
expect "again, the same" "$(gen "$tmp/repo")" "$("$git" rev-parse --short HEAD)"
expect "not rewritten when the same" "$(stat -c %Y.%s "$tmp/h.h")" "$stamp"
echo b > f
expect "an edit" "$(gen "$tmp/repo")" "$("$git" rev-parse --short HEAD)-dirty"
"$git" commit -q -am two
expect "a new commit" "$(gen "$tmp/repo")" "$("$git" rev-parse --short HEAD)"
expect "not a checkout" "$(gen "$tmp/plain")" "unknown"
mkdir "$tmp/repo/sub"
expect "a folder inside another checkout" "$(gen "$tmp/repo/sub")" "unknown"
exit $fail
