#!/usr/bin/env bash
# sass-diff.sh — whether a change to kernels/ changes the machine code: compiles
# kernels/coop.cu for sm_90 at a git revision and in the working tree, and compares the
# SASS of every kernel, instruction by instruction (addresses, encodings and line info
# left out). A refactor that must not change the kernels shows "identical"; a change
# meant to change them shows which kernels differ and by how many instructions.
# No GPU needed. Tools as scripts/check-sass.sh (nvcc; cuobjdump and nvdisasm from the
# toolkit or ~/.cache/syncbn-tools).
# Usage: scripts/sass-diff.sh REV [ARCH]   (ARCH: 90 by default)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
REV=${1:?usage: scripts/sass-diff.sh REV [ARCH]}
ARCH=${2:-90}
. scripts/cuda-tools.sh
sbn_find_nvcc
[ -n "$NVCC" ] || { echo "sass-diff: no nvcc" >&2; exit 2; }
sbn_find_disasm
if [ -z "$CUOBJDUMP" ] || [ -z "$NVDISASM" ]; then
  echo "sass-diff: no cuobjdump/nvdisasm (run scripts/check-sass.sh once: it installs them)" >&2
  exit 2
fi
TMP=$(mktemp -d "${TMPDIR:-/tmp}/sass-diff.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
sbn_kernel_defs
mkdir -p "$TMP/base"
git archive "$REV" kernels include | tar -x -C "$TMP/base"
build() { # dir out
  (cd "$1" && sbn_coop_cubin "$ARCH" "$2" -lineinfo)
}
echo "sass-diff: sm_$ARCH, $REV vs the working tree"
build "$TMP/base" "$TMP/base.cubin" &
build "$PWD" "$TMP/new.cubin" &
wait %1 && wait %2
"$CUOBJDUMP" -sass "$TMP/base.cubin" > "$TMP/base.sass"
"$CUOBJDUMP" -sass "$TMP/new.cubin" > "$TMP/new.sass"
python3 - "$TMP/base.sass" "$TMP/new.sass" <<'PY'
import re, sys
def kernels(path):
    fs, cur = {}, None
    for line in open(path):
        m = re.search(r"Function : (\S+)", line)
        if m:  # the anonymous namespace's hash differs between builds
            cur = re.sub(r"_GLOBAL__N__[0-9a-f]+_", "_GLOBAL__N__", m.group(1))
            fs[cur] = []
            continue
        m = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s*(.*?)\s*;?\s*/\*", line)
        if cur is not None and m:
            fs[cur].append(m.group(1))
    return fs
a, b = kernels(sys.argv[1]), kernels(sys.argv[2])
gone, new = sorted(set(a) - set(b)), sorted(set(b) - set(a))
diff = sorted(k for k in set(a) & set(b) if a[k] != b[k])
print(f"{len(a)} kernels before, {len(b)} after; {len(gone)} gone, {len(new)} new, {len(diff)} changed")
for k in gone: print("  gone:", k)
for k in new: print("  new: ", k)
for k in diff: print(f"  changed: {k} ({len(a[k])} -> {len(b[k])} instructions)")
if not gone and not new and not diff: print("sass-diff: identical")
PY
