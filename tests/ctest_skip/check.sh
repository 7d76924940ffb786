#!/usr/bin/env bash
# tests/ctest_skip/check.sh [CMAKE] [BUILD_DIR]: configure, build and test this project with
# CMAKE (default: cmake on PATH; its ctest beside it) and check that CTest reports each suite
# of skip_demo.cpp as expected: skips as skipped, a failure as failed even when the same
# suite skips. Exits 1 on any difference.
set -euo pipefail
cmake=${1:-cmake}
cmake_bin=$(command -v "$cmake") || { echo "check.sh: no CMake at '$cmake'" >&2; exit 1; }
cmake_bin=$(cd "$(dirname "$cmake_bin")" && pwd)/$(basename "$cmake_bin")
ctest=$(dirname "$cmake_bin")/ctest
[[ -x $ctest ]] || { echo "check.sh: no ctest beside $cmake_bin" >&2; exit 1; }
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
build=${2:-$(mktemp -d)}
version=$("$cmake_bin" --version | head -n 1)

"$cmake_bin" -S "$here" -B "$build" -G Ninja >"$build.configure.log" 2>&1 ||
  { cat "$build.configure.log"; exit 1; }
"$cmake_bin" --build "$build" >"$build.build.log" 2>&1 || { cat "$build.build.log"; exit 1; }
# The project has a failing suite on purpose, so ctest exits non-zero; its report is the result.
(cd "$build" && "$ctest" --timeout 60 >"$build.ctest.log" 2>&1) || true

expected="skip_demo.FailsAndSkips Failed
skip_demo.Odd/Params Skipped
skip_demo.Passes Passed
skip_demo.PassesAndSkips Passed
skip_demo.Skips Skipped
skip_demo.Then/After Passed"
# "1/5 Test #1: skip_demo.Passes ........   Passed    0.01 sec" -> "skip_demo.Passes Passed"
reported=$(sed -nE 's/^ *[0-9]+\/[0-9]+ Test +#[0-9]+: ([^ ]+) \.*[ *]*([A-Za-z]+).*/\1 \2/p' "$build.ctest.log" | LC_ALL=C sort)
if [[ $reported != "$expected" ]]; then
  echo "check.sh: $version: CTest reported"
  echo "$reported"
  echo "check.sh: expected"
  echo "$expected"
  cat "$build.ctest.log"
  exit 1
fi
echo "check.sh: $version: a skipped suite reads as skipped, a failure as failed (6 suites as expected)"
