#!/usr/bin/env bash
# Builds rollstack's static in-sandbox helpers with Debian's gcc and glibc (libc6-dev's libc.a).
# Output: native/build/rollstack-execd (run in every environment, found by rollstack.run.initbin)
# and native/build/rollstack-treecp (the fork's copy of a frozen upper, rollstack.run.snapshot).
# Idempotent.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="$here/build"
mkdir -p "$out"
${CC:-gcc} -static -O2 -Wall -Wextra -Werror -o "$out/rollstack-execd.tmp" "$here/execd/execd.c"
mv "$out/rollstack-execd.tmp" "$out/rollstack-execd"
${CC:-gcc} -static -O2 -Wall -Wextra -Werror -o "$out/rollstack-treecp.tmp" "$here/treecp/treecp.c"
mv "$out/rollstack-treecp.tmp" "$out/rollstack-treecp"
echo "built $out/rollstack-execd and $out/rollstack-treecp" >&2
