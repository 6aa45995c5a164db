"""The idle-CPU pacer of background work (host.cpuidle; pure: a fake meter and sleep)."""

from __future__ import annotations

from rollstack.host.cpuidle import idle_pacer


class _Meter:
    window = 0.2

    def __init__(self, values):
        self.values = list(values)

    def idle(self):
        return self.values.pop(0) if len(self.values) > 1 else self.values[0]


def test_pacer_waits_for_idle_cores_and_gives_up_after_max_wait():
    slept: list[float] = []
    pace = idle_pacer(0.5, _Meter([0.0, 0.1, 1.0]), sleep=slept.append)
    assert pace() == 0.4 and slept == [0.2, 0.2]
    assert pace() == 0.0  # idle now
    never = idle_pacer(0.5, _Meter([0.0]), max_wait=1.0, sleep=lambda s: None)
    assert never() >= 1.0  # a node that is never idle still makes progress
    assert idle_pacer(0.0, _Meter([0.0]), sleep=slept.append)() == 0.0


def test_pacer_stops_waiting_once_someone_waits_for_the_work():
    urgent = []
    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(s)
        urgent.append(True)  # a create starts waiting while we pace

    pace = idle_pacer(0.5, _Meter([0.0]), max_wait=10.0, sleep=sleep, until=lambda: bool(urgent))
    assert pace() == 0.2 and slept == [0.2]
