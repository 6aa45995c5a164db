"""Elastic CPU and memory provisioning: cgroup backends, the pure quota policy, the 200 ms loop.

    backend = detect_backend()                       # CgroupV1 on this host, CgroupV2 elsewhere
    prov = Provisioner(backend, PolicyConfig(), NodeCapacity(cpu=2, memory=24 << 30),
                       on_terminate=lambda env_id, reason: ...)
    prov.start()
    if prov.admit(0.5, 256 << 20):
        prov.register("e1", "rollstack/e1", start_cpu=0.5, start_memory=256 << 20)
    prov.stats("e1")  # {"quota", "history", "events"}
    prov.unregister("e1"); prov.stop()
"""

from rollstack.provision.backend import CgroupBackend
from rollstack.provision.detect import detect_backend
from rollstack.provision.cgroup_v1 import CgroupV1
from rollstack.provision.cgroup_v2 import CgroupV2
from rollstack.provision.config import NodeCapacity, PolicyConfig
from rollstack.provision.controller import Provisioner
from rollstack.provision.policy import Decision, EnvState, NodeView, QuotaPolicy
from rollstack.provision.sample import CgroupSample

__all__ = [
    "CgroupBackend",
    "CgroupV1",
    "CgroupV2",
    "CgroupSample",
    "detect_backend",
    "PolicyConfig",
    "NodeCapacity",
    "QuotaPolicy",
    "EnvState",
    "NodeView",
    "Decision",
    "Provisioner",
]
