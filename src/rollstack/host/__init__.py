"""Facts about the host, read or changed in one place: the mount table, unmounting, the cgroup
tree rollstack owns and its OOM counters.

Part of the core every stage may import (it imports nothing from rollstack but `errors`).
"""
