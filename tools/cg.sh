#!/bin/bash
# tools/cg.sh BUILD SCENARIO: instructions per packet of a dpu bench scenario under callgrind, as
# the difference of two whole-program counts (a run with 0 and one with 400,000 measured packets
# after the same warm-up), so Python's start-up and the scenario's set-up cancel out. BUILD is a
# checkout with its extension built in place (setup.py build_ext --inplace). Independent of the
# machine's load: what docs/performance.md's A/B tables use when wall clocks are too noisy.
set -e
build=$(cd "$1" && pwd); scen=$2; n=400000
here=$(cd "$(dirname "$0")" && pwd)
py=${PYTHON:-python3}
run() {
  out=$(mktemp)
  (cd "$build" && PYTHONHASHSEED=0 PYTHONPATH="$build" valgrind --tool=callgrind --callgrind-out-file="$out" \
     "$py" "$here/cg.py" "$scen" "$1" >/dev/null 2>&1)
  grep "^summary\|^totals" "$out" | head -1 | awk '{print $2}'
  rm -f "$out"
}
a=$(run 0); b=$(run $n)
echo "$scen $(basename "$build"): $(( (b - a) / n )) instructions/packet"
