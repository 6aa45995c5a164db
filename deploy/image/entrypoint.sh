#!/bin/sh
# Entrypoint of the rollstack-node image. With ROLLSTACK_CGROUP_DELEGATE=1 (the environment-node
# pods) on cgroup v2: move every process of the container out of its cgroup namespace's root
# into a leaf (`init`) and enable the cpu, memory and pids controllers for children, so the node
# agent can create `rollstack/<env-id>` cgroups under the pod's cgroup (v2 forbids enabling
# controllers for children of a cgroup that holds processes). On cgroup v1 nothing is needed.
# With arguments it then execs them (the image's ENTRYPOINT); without, it returns, so KubeRay's
# generated `<command> && ulimit ...; ray start ...` runs `ray start` in the delegated tree.
set -eu
if [ "${ROLLSTACK_CGROUP_DELEGATE:-0}" = 1 ] && [ -f /sys/fs/cgroup/cgroup.controllers ]; then
  mkdir -p /sys/fs/cgroup/init
  # a process can exit between the listing and the move: retry until the root is empty
  for _ in 1 2 3 4 5; do
    xargs -rn1 < /sys/fs/cgroup/cgroup.procs > /sys/fs/cgroup/init/cgroup.procs 2>/dev/null || true
    [ -s /sys/fs/cgroup/cgroup.procs ] || break
  done
  for c in cpu memory pids; do
    if grep -qw "$c" /sys/fs/cgroup/cgroup.controllers; then
      echo "+$c" > /sys/fs/cgroup/cgroup.subtree_control
    fi
  done
fi
if [ "$#" -gt 0 ]; then exec "$@"; fi
