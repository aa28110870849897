#!/bin/sh
# test_cli.sh — one run of sbn-bench from the command line, and how it must end: its exit
# status, texts its output (stdout and stderr) must hold (a TEXT that starts with '!': the
# rest must not be there), and for a usage error (status 2) that nothing ran (no table
# header printed).
#   test_cli.sh STATUS TEXT... -- SBN_BENCH [ARGS...]
set -f # the texts are literal ("[1, 4096]" is no glob)
want=$1
shift
texts=""
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
  texts="$texts$1
"
  shift
done
if [ $# -lt 2 ]; then
  echo "usage: test_cli.sh STATUS TEXT... -- COMMAND [ARGS...]" >&2
  exit 2
fi
shift
out=$("$@" 2>&1)
rc=$?
printf '%s\n' "$out"
fail=0
if [ "$rc" -ne "$want" ]; then
  echo "test_cli.sh: exit status $rc, expected $want"
  fail=1
fi
IFS='
'
for t in $texts; do
  case $t in
    !*)
      case $out in
        *"${t#!}"*) echo "test_cli.sh: the output holds: ${t#!}"; fail=1 ;;
      esac
      ;;
    *)
      case $out in
        *"$t"*) ;;
        *) echo "test_cli.sh: the output lacks: $t"; fail=1 ;;
      esac
      ;;
  esac
done
if [ "$want" -eq 2 ]; then
  case $out in
    *"# sbn-bench  syncbn"*) echo "test_cli.sh: a usage error reported after the run began"; fail=1 ;;
  esac
fi
exit $fail
