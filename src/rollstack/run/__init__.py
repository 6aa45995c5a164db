"""One environment's OS side: overlayfs root, OCI spec, runc, exec, safe files, upper diff.

Modules (each one concept): `overlay` (mount/unmount), `ocispec` (pure config.json builder),
`runc` (blocking runc wrapper), `execpump` (one exec's I/O and timeout), `procs` (tree kill/reap), `cgroupfs` (env cgroup dirs),
`initbin` (static init binaries), `files` (SafeRoot), `lowerview` + `diff` (upper as a unified
diff), `environment` (EnvironmentRuntime/Environment lifecycle, crash leftovers), `measure`
(latency script). See docs/runtime.md. Importing this package has no side effects.
"""

from rollstack.run.diff import DEFAULT_EXCLUDES, upper_diff
from rollstack.run.environment import (
    Environment, EnvironmentRuntime, Leftovers, RuntimeConfig, cleanup_leftovers, find_leftovers,
)
from rollstack.run.files import FileInfo, SafeRoot
from rollstack.run.lowerview import LowerView
from rollstack.run.ocispec import InitBinaries, SpecParams, build_spec
from rollstack.run.overlay import is_mounted, mount_overlay, unmount
from rollstack.run.runc import ExecResult, Runc

__all__ = [
    "DEFAULT_EXCLUDES", "Environment", "EnvironmentRuntime", "ExecResult", "FileInfo",
    "InitBinaries", "Leftovers", "LowerView", "Runc", "RuntimeConfig", "SafeRoot", "SpecParams",
    "build_spec", "cleanup_leftovers", "find_leftovers", "is_mounted", "mount_overlay",
    "unmount", "upper_diff",
]
