#!/usr/bin/env bash
# check-history-words.sh — the tracked files must not speak of how the project was made:
# no "session" followed by a number, in any case, singular or plural ("session N",
# "Sessions N-M"). Code, comments, docs, scripts, tests and the results' READMEs name a
# measurement by its date, device and commit, or by its folder
# (bench/results/<date>-<device>-<commit>/); a change's history goes to CHANGELOG.md.
#
# Looks at the files git tracks (git grep: the working tree's version of each tracked
# file; untracked files and the commit history are not looked at):
#   - git grep -n -i -E 'sessions? [0-9]' (the word and the number on one line),
#   - and the same split over two lines: a line ending in the word whose next line starts,
#     after comment leaders (#, //, /*, *, <!--) and blanks, with a digit.
# Prints every hit as file:line:text and exits 1 if there is one; exits 0 otherwise.
# Usage: scripts/check-history-words.sh   (from anywhere inside the repository)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PATTERN='sessions? [0-9]'
# git grep: 0 found, 1 found nothing, anything else an error (not a repository, ...)
grep_tracked() {
  local rc=0
  git grep "$@" || rc=$?
  [ $rc -le 1 ] || { echo "check-history-words: git grep failed ($rc)" >&2; exit 2; }
}
hits=$(grep_tracked -n -i -E "$PATTERN")

# The word at the end of a line, the number at the start of the next.
wrapped=$(grep_tracked -z -l -I -i -E 'sessions?[[:space:]]*$' |
  while IFS= read -r -d '' f; do
    awk -v f="$f" '
      prev && /^[[:space:]#*\/<!-]*[0-9]/ { print f ":" NR - 1 ":" prevtext " / " $0 }
      { prev = (tolower($0) ~ /(^|[^a-z])sessions?[[:space:]]*$/); prevtext = $0 }
    ' "$f"
  done)

if [ -n "$hits" ] || [ -n "$wrapped" ]; then
  echo "check-history-words: FAILED: tracked files name a session; name the run by date," \
    "device and commit (bench/results/<date>-<device>-<commit>/) or drop the history:"
  [ -z "$hits" ] || printf '%s\n' "$hits"
  [ -z "$wrapped" ] || printf '%s\n' "$wrapped"
  n=$( (printf '%s\n' "$hits" "$wrapped" | grep -c . ) || true)
  echo "check-history-words: $n line(s)"
  exit 1
fi
echo "check-history-words: ok (no 'session N' in $(git ls-files | wc -l) tracked files)"
