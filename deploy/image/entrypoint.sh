#!/bin/sh
# Entrypoint of the rollstack-node image. With ROLLSTACK_CGROUP_DELEGATE=1 (the environment-node
# pods) on cgroup v2: move every process of the container out of its cgroup namespace's root
# into a leaf (`init`) and enable the cpu, memory and pids controllers for children, so the node
# agent can create `rollstack/<env-id>` cgroups under the pod's cgroup (v2 forbids enabling
# controllers for children of a cgroup that holds processes). On cgroup v1 nothing is needed.
# With arguments it then execs them (the image's ENTRYPOINT); without, it returns, so KubeRay's
# generated `<command> && ulimit ...; ray start ...` runs `ray start` in the delegated tree.
# ROLLSTACK_CGROUP_ROOT (default /sys/fs/cgroup) exists for the offline test.
set -eu
CG=${ROLLSTACK_CGROUP_ROOT:-/sys/fs/cgroup}
if [ "${ROLLSTACK_CGROUP_DELEGATE:-0}" = 1 ] && [ -f "$CG/cgroup.controllers" ]; then
  mkdir -p "$CG/init"
  # a process can start or exit between the listing and the move: retry a few times
  for _ in 1 2 3 4 5; do
    xargs -rn1 < "$CG/cgroup.procs" > "$CG/init/cgroup.procs" 2>/dev/null || true
    [ -s "$CG/cgroup.procs" ] || break
  done
  want=""
  for c in cpu memory pids; do
    if grep -qw "$c" "$CG/cgroup.controllers"; then want="$want +$c"; fi
  done
  if [ -n "$want" ]; then echo "${want# }" > "$CG/cgroup.subtree_control"; fi
fi
if [ "$#" -gt 0 ]; then exec "$@"; fi
