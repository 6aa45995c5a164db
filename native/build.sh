#!/usr/bin/env bash
# Builds rollstack's static in-sandbox helpers with Debian's gcc and glibc (libc6-dev's libc.a).
# Output: native/build/rollstack-execd (found by rollstack.run.initbin). Idempotent.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="$here/build"
mkdir -p "$out"
${CC:-gcc} -static -O2 -Wall -Wextra -Werror -o "$out/rollstack-execd.tmp" "$here/execd/execd.c"
mv "$out/rollstack-execd.tmp" "$out/rollstack-execd"
echo "built $out/rollstack-execd" >&2
