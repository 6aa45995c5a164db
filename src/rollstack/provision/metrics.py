"""Prometheus view of a `Provisioner`, built at scrape time (zero cost per 200 ms tick)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from rollstack.provision.controller import Provisioner


class ProvisionerCollector(Collector):
    """Per-environment quotas/usage and node committed/reserve gauges."""

    def __init__(self, provisioner: "Provisioner") -> None:
        self.p = provisioner

    def collect(self) -> Iterator[GaugeMetricFamily]:
        p = self.p
        node = p.committed()
        for name, key, doc in (
            ("rollstack_node_committed_cpu_cores", "cpu", "Sum of CPU quotas of managed environments"),
            ("rollstack_node_committed_memory_bytes", "memory", "Sum of memory quotas of managed environments"),
            ("rollstack_node_reserve_cpu_cores", "reserve_cpu", "CPU quota kept for admissions"),
            ("rollstack_node_reserve_memory_bytes", "reserve_memory", "Memory kept for admissions"),
            ("rollstack_node_capacity_cpu_cores", "capacity_cpu", "CPU quota capacity (cores x overcommit)"),
            ("rollstack_node_capacity_memory_bytes", "capacity_memory", "Memory capacity"),
        ):
            yield GaugeMetricFamily(name, doc, value=node[key])
        fams = {
            "cpu_limit": GaugeMetricFamily("rollstack_env_cpu_limit_cores", "CPU quota", labels=["env"]),
            "memory_limit": GaugeMetricFamily("rollstack_env_memory_limit_bytes", "Memory quota", labels=["env"]),
            "cpu_usage": GaugeMetricFamily("rollstack_env_cpu_usage_cores", "CPU usage", labels=["env"]),
            "memory_usage": GaugeMetricFamily("rollstack_env_memory_usage_bytes", "Memory usage", labels=["env"]),
        }
        for env_id in p.env_ids():
            try:
                h = p.history(env_id)
            except LookupError:
                continue
            if h:
                for key, fam in fams.items():
                    fam.add_metric([env_id], h[-1][key])
        yield from fams.values()
        cost = p.loop_cost()
        yield CounterMetricFamily("rollstack_provision_samples", "Cgroup samples taken", value=cost["samples"])
        yield GaugeMetricFamily("rollstack_provision_loop_core_percent", "Loop CPU, % of one core",
                                value=cost["percent_of_core"])  # fmt: skip
