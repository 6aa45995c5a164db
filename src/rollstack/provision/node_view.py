"""`NodeView`: the node's committed quotas against its capacity, and the two rules on them.

- *admission* (`admits`): committed + start quotas <= capacity; the reserve MAY be used.
- *scale-up budget* (`grow_budget_*`): grows may raise committed only up to capacity x (1 - reserve).
CPU capacity is cores x `PolicyConfig.cpu_overcommit`; memory is never overcommitted.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from rollstack.provision.config import NodeCapacity, PolicyConfig

CPU_EPS = 1e-6
"""Float slack for CPU comparisons (cores)."""


@dataclass(frozen=True)
class NodeView:
    """The node as a decision sees it: capacity (CPU already x overcommit) and what is committed."""

    cpu_capacity: float
    memory_capacity: int
    committed_cpu: float
    committed_memory: int
    reserve_cpu: float
    reserve_memory: int

    @classmethod
    def of(cls, capacity: NodeCapacity, config: PolicyConfig, committed_cpu: float, committed_memory: int) -> "NodeView":
        cpu_cap = capacity.cpu * config.cpu_overcommit
        return cls(
            cpu_capacity=cpu_cap,
            memory_capacity=capacity.memory,
            committed_cpu=committed_cpu,
            committed_memory=committed_memory,
            reserve_cpu=cpu_cap * config.reserve_cpu_fraction,
            reserve_memory=int(capacity.memory * config.reserve_memory_fraction),
        )

    def grow_budget_cpu(self) -> float:
        """How much CPU quota scale-ups may still add without eating the reserve (>= 0)."""
        return max(0.0, self.cpu_capacity - self.reserve_cpu - self.committed_cpu)

    def grow_budget_memory(self) -> int:
        return max(0, self.memory_capacity - self.reserve_memory - self.committed_memory)

    def admits(self, cpu: float, memory: int) -> bool:
        """Admission: start quotas fit in capacity minus committed (the reserve may be used)."""
        return (
            self.committed_cpu + cpu <= self.cpu_capacity + CPU_EPS
            and self.committed_memory + memory <= self.memory_capacity
        )

    def with_delta(self, cpu: float, memory: int) -> "NodeView":
        return replace(self, committed_cpu=self.committed_cpu + cpu, committed_memory=self.committed_memory + memory)
