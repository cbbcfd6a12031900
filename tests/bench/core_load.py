"""How busy other processes kept the benchmark's two cores while a figure was measured.

The load average says the machine was busy; this says whether the busy part landed on the cores under
test, which is what makes a tail latency figure meaningless. Read from /proc: a core's busy jiffies minus
the CPU time of the benchmark's own processes on it.
"""

from __future__ import annotations

import os
import resource
import time
from dataclasses import dataclass

_BUSY_FIELDS = (0, 1, 2, 5, 6, 7)  # user nice system irq softirq steal
_TICKS = os.sysconf("SC_CLK_TCK")
NOISY_PERCENT = 10.0
"""Other work above this share of a benchmark core makes a figure suspect."""


def _core_busy_s(core: int) -> float:
    with open("/proc/stat") as stat:
        for line in stat:
            if line.startswith(f"cpu{core} "):
                fields = [int(x) for x in line.split()[1:]]
                return sum(fields[i] for i in _BUSY_FIELDS) / _TICKS
    raise ValueError(f"no cpu{core} in /proc/stat")


def _process_cpu_s(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICKS  # utime, stime


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


@dataclass
class CoreWatch:
    """Started before a figure, read after it: the share of ``core`` used by anything but the benchmark's own
    processes ``pids`` (and, with ``children``, the load generators this process ran and waited for)."""

    core: int
    pids: tuple[int, ...] = ()
    children: bool = False

    def __post_init__(self) -> None:
        self._wall = time.monotonic()
        self._busy = _core_busy_s(self.core)
        self._own = self._own_cpu_s()

    def _own_cpu_s(self) -> float:
        own = sum(_process_cpu_s(pid) for pid in self.pids)
        return own + _children_cpu_s() if self.children else own

    def foreign_percent(self) -> float:
        wall = time.monotonic() - self._wall
        busy = _core_busy_s(self.core) - self._busy
        own = self._own_cpu_s() - self._own
        return round(max(0.0, busy - own) / wall * 100, 1) if wall > 0 else 0.0


def wait_for_quiet(
    cores: tuple[int, ...], *, busy_below: float = NOISY_PERCENT, window_s: float = 0.5, timeout_s: float = 2.0
) -> float:
    """Wait, up to ``timeout_s``, for a window in which every core was less than ``busy_below`` percent busy.

    Called while the benchmark idles between figures, so whatever keeps a core busy is someone else's work;
    returns the busiest core's percent in the last window (still high when the wait gave up).
    """
    deadline = time.monotonic() + timeout_s
    while True:
        before = [_core_busy_s(core) for core in cores]
        time.sleep(window_s)
        busy = max((_core_busy_s(core) - b) / window_s * 100 for core, b in zip(cores, before, strict=True))
        if busy < busy_below or time.monotonic() >= deadline:
            return round(min(busy, 100.0), 1)
