#!/usr/bin/env bash
# check_layers.sh — the library's layers as its object files link them (docs/DESIGN.md):
#   core     result, diag, config, team, memkind: types, diagnostics, team lifecycle
#   front    comm, ops, group: the public calls; they reach a backend through its table
#   backends cpu/*, gpu/*: the team kinds behind the team-ops table
# A backend may use the core, never the front; the core uses neither. Checked on the
# symbols: no backend object has an undefined symbol that a front object defines, and no
# core object one that a front or backend object defines.
# Usage: check_layers.sh NM OBJECT...   (the objects of the library, e.g. syncbn_obj's)
set -euo pipefail
NM=$1
shift
core=() front=() backend=()
for o in "$@"; do
  rel=${o##*.dir/} # the path below the target's object directory
  rel=${rel#./}    # (Ninja's paths have ./ there: syncbn_obj.dir/./comm.c.o)
  case "$rel" in
    *cpu/*.o | *gpu/*.o | *kernels/*.o) backend+=("$o") ;;
    comm.c.o | ops.c.o | group.c.o) front+=("$o") ;;
    *) core+=("$o") ;;
  esac
done
if [ ${#core[@]} -eq 0 ] || [ ${#front[@]} -eq 0 ] || [ ${#backend[@]} -eq 0 ]; then
  echo "check_layers: expected core, front and backend objects; got ${#core[@]}, ${#front[@]}, ${#backend[@]}" >&2
  exit 2
fi
defined() { "$NM" --defined-only "$@" 2>/dev/null | awk 'NF == 3 && $2 ~ /[TDBR]/ { print $3 }' | sort -u; }
undefined() { # object: its undefined symbols
  "$NM" --undefined-only "$1" | awk '{ print $NF }' | sort -u
}
front_syms=$(defined "${front[@]}")
upper_syms=$(printf '%s\n%s\n' "$front_syms" "$(defined "${backend[@]}")" | sort -u)
bad=0
check() { # layer, what it must not call, those symbols, objects...
  local layer=$1 what=$2 syms=$3 o hits
  shift 3
  for o in "$@"; do
    hits=$(comm -12 <(undefined "$o") <(printf '%s\n' "$syms"))
    if [ -n "$hits" ]; then
      echo "check_layers: $layer $(basename "$o") calls $what: $(echo $hits)"
      bad=1
    fi
  done
}
check backend "the front" "$front_syms" "${backend[@]}"
check core "the front or a backend" "$upper_syms" "${core[@]}"
if [ $bad -ne 0 ]; then exit 1; fi
echo "check_layers: OK (${#core[@]} core, ${#front[@]} front, ${#backend[@]} backend objects)"
