#!/usr/bin/env bash
# Runs a TSAN build's unit tests and the host-path integration tests under
# tools/sanitizer/tsan.supp and summarizes the reports (docs/reliability.md, "Sanitizers").
# Reports land in $TSAN_REPORTS/report.<pid> (default /tmp/tsan, emptied first); test output in
# $TSAN_REPORTS/<test>.log. Not run in CI. Usage: tools/sanitizer/run_tsan.sh [BUILD_DIR]
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=$(realpath "${1:-$ROOT/build-tsan}")
OUT=${TSAN_REPORTS:-/tmp/tsan}
rm -rf "$OUT" && mkdir -p "$OUT"
# With UCX's memory hooks on, libucm's madvise hook calls into TSAN from exiting threads and
# every UCX test segfaults.
export UCX_MEM_EVENTS=no
# exitcode=0: the tests judge behaviour; the reports are read from the files.
export TSAN_OPTIONS="suppressions=$ROOT/tools/sanitizer/tsan.supp log_path=$OUT/report exitcode=0 second_deadlock_stack=1 ${TSAN_OPTIONS:-}"
failed=0
for t in $(find "$BUILD/tests/unit" -name '*_test' -type f -executable | sort); do
  name=$(basename "$t")
  if "$t" >"$OUT/$name.log" 2>&1; then echo "ok    $name"; else echo "FAIL  $name"; failed=1; fi
done
# Host-path and fault integration tests (the soak test is left out: minutes under TSAN).
if [[ -x $BUILD/src/server/refitd ]]; then
  for suite in host_path faults; do
    (cd "$ROOT/tests/integration/$suite" && REFIT_SOURCE_DIR=$ROOT REFIT_BINARY_DIR=$BUILD \
       python3 -m pytest -q -p no:cacheprovider --ignore=test_soak.py) >"$OUT/$suite.log" 2>&1 || failed=1
    echo "$suite: $(tail -1 "$OUT/$suite.log")"
  done
fi
reports=$(cat "$OUT"/report.* 2>/dev/null | grep -c '^WARNING: ThreadSanitizer' || true)
echo "TSAN reports: $reports (in $OUT/report.*)"
cat "$OUT"/report.* 2>/dev/null | grep '^SUMMARY: ThreadSanitizer' | sort | uniq -c | sort -rn
exit $failed
