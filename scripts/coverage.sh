#!/usr/bin/env bash
# scripts/coverage.sh [BUILD] — which lines of the library (src/), the kernels (kernels/, run
# by the emulator) and the float64 reference (reference/) the CPU tests never execute.
#
# Builds the cpu preset's configuration with gcc's --coverage into BUILD (default
# build/coverage; -O1, as the tsan and asan presets: the emulator's suite at -O0 would take
# several times as long), runs its tests but the Python and pip ones (`ctest -E
# "python|pip"`), and prints gcovr's table, a kernel's template copies merged into one count
# per line (--merge-lines): a line is missed when no copy ran it. gcovr comes from PYTHON's
# packages, else from a virtual environment made for it in BUILD (pip, PyPI).
# What it does not say: whether a line's result is checked (the tests' assertions and their
# mutants do). At -O1 a line the compiler merged into its neighbour may be counted with it.
# The mutant tests run the library too, so what only they reach counts as run. The counters
# are not updated atomically (-fprofile-update=atomic made the emulator's suite pass its
# CTest time limit): threads racing on one may lose counts, never turn a run line into
# a missed one, and gcovr's "Ignoring negative hits" warnings are those. A failed test is
# said, and the report is still printed (exit 1). ~4 minutes to build and ~5 to test on 2
# cores.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=$(mkdir -p "${1:-$ROOT/build/coverage}" && cd "${1:-$ROOT/build/coverage}" && pwd)
PYTHON=${PYTHON:-python3}
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 2)}

if "$PYTHON" -c 'import gcovr' 2>/dev/null; then
  GCOVR=("$PYTHON" -m gcovr)
else
  [ -x "$BUILD/gcovr-venv/bin/gcovr" ] ||
    { "$PYTHON" -m venv "$BUILD/gcovr-venv" && "$BUILD/gcovr-venv/bin/pip" install -q gcovr; }
  GCOVR=("$BUILD/gcovr-venv/bin/gcovr")
fi

cmake -S "$ROOT" -B "$BUILD" -DSYNCBN_CUDA=OFF -DCMAKE_BUILD_TYPE=Debug \
  -DCMAKE_C_FLAGS_DEBUG="-g -O1 --coverage" -DCMAKE_CXX_FLAGS_DEBUG="-g -O1 --coverage" \
  -DCMAKE_EXE_LINKER_FLAGS=--coverage -DCMAKE_SHARED_LINKER_FLAGS=--coverage >/dev/null
cmake --build "$BUILD" -j "$JOBS"
find "$BUILD" -name '*.gcda' -delete # counts of this run only
rc=0
ctest --test-dir "$BUILD" -j "$JOBS" -E 'python|pip' >"$BUILD/ctest.log" 2>&1 || rc=$?
grep -E 'tests passed|tests failed|\(Failed\)|\(Timeout\)' "$BUILD/ctest.log" || true
"${GCOVR[@]}" -r "$ROOT" --object-directory "$BUILD" -f "$ROOT/src/" -f "$ROOT/kernels/" \
  -f "$ROOT/reference/" -e '.*mutant.*' --merge-lines --gcov-ignore-parse-errors=all \
  --txt - "$BUILD" 2> >(grep -v 'Ignoring negative hits' >&2)
[ $rc -eq 0 ] || { echo "coverage: some tests failed ($BUILD/ctest.log): the counts are of a failed run" >&2; exit 1; }
