#!/usr/bin/env bash
# `make demo` as a new user meets it, N times in a row: each run on a cold node (its root wiped,
# the page cache dropped), the demo's own leftover check and `rollstack node doctor` after each.
# Usage: scripts/demo-soak.sh [N=20]; exits 1 at the first failed run.
set -euo pipefail
cd "$(dirname "$0")/.."
n="${1:-20}"
root=/var/lib/rollstack/demo
for i in $(seq 1 "$n"); do
  rm -rf "$root/node"
  sync; echo 3 > /proc/sys/vm/drop_caches
  start=$(date +%s)
  if ! .venv/bin/rollstack demo --json > "/tmp/demo-soak-$i.json" 2> "/tmp/demo-soak-$i.log"; then
    echo "run $i: FAILED (see /tmp/demo-soak-$i.log)"; exit 1
  fi
  .venv/bin/rollstack node doctor --root "$root/node" --json > /dev/null || { echo "run $i: node doctor found leftovers"; exit 1; }
  echo "run $i: ok ($(( $(date +%s) - start )) s)"
done
echo "$n runs in a row passed"
