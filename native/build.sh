#!/usr/bin/env bash
# Builds rollstack's static in-sandbox helpers with Debian's gcc and glibc (libc6-dev's libc.a).
# Output: native/build/rollstack-execd (run in every environment, found by rollstack.run.initbin)
# native/build/rollstack-treecp (the fork's copy of a frozen upper, rollstack.run.snapshot) and
# native/build/rollstack-rootswitch (a late-bound sandbox's switch to its root, rollstack.run.lateroot).
# Idempotent.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="$here/build"
mkdir -p "$out"
${CC:-gcc} -static -O2 -Wall -Wextra -Werror -o "$out/rollstack-execd.tmp" "$here/execd/execd.c"
mv "$out/rollstack-execd.tmp" "$out/rollstack-execd"
${CC:-gcc} -static -O2 -Wall -Wextra -Werror -o "$out/rollstack-treecp.tmp" "$here/treecp/treecp.c"
mv "$out/rollstack-treecp.tmp" "$out/rollstack-treecp"
${CC:-gcc} -static -O2 -Wall -Wextra -Werror -o "$out/rollstack-rootswitch.tmp" "$here/rootswitch/rootswitch.c"
mv "$out/rollstack-rootswitch.tmp" "$out/rollstack-rootswitch"
echo "built $out/rollstack-execd, rollstack-treecp and rollstack-rootswitch" >&2
