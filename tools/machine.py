"""How loaded the machine was while a benchmark ran, beside its figures.

A ratio taken while other work shares the CPUs can flatter or spoil a figure, and a virtual
machine's host can take CPU time away unseen by the load average ("steal").  ``Watch``
reads the kernel's CPU counters (/proc/stat) and this process's and its children's CPU time
at the start and at the end, and says what share of the CPUs went to other processes and
to the host in between.  Where /proc/stat is missing, only the load average is told.

Neither shows a host whose other guests share this machine's physical cores (the same work
then simply takes longer, CPU time included: on the development machine a capture's CPU time
moved from 4.2 s to 5.3 s between two quiet hours).  So ``Watch`` also times a fixed piece of
CPU-bound Python at the start and at the end (``calibration_ms``): on the same machine, a
larger number is a slower CPU, and figures taken then are slower by about as much.
"""

from __future__ import annotations

import compileall
import importlib.util
import os
import resource
import time


def compile_syncpack() -> None:
    """Compile the bytecode of the syncpack the benchmarks' commands import, as ``pip install``
    does for an installed package: an editable install run with ``PYTHONDONTWRITEBYTECODE=1``
    (as on the shared machine) would otherwise compile every module from source in every
    command (~0.15 s of CPU a process, a capture's reader child too), which the plain-SQLite
    baselines, importing only precompiled modules, never pay."""
    spec = importlib.util.find_spec("syncpack")
    for where in (spec.submodule_search_locations or []) if spec else []:
        compileall.compile_dir(where, quiet=1)


def _cpu_counters() -> tuple[float, float, float] | None:
    """(busy, steal, total) CPU seconds of the whole machine since boot, or None."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    ticks = [int(x) for x in fields[1:]]
    hz = os.sysconf("SC_CLK_TCK")
    user, nice, system, idle, iowait, irq, softirq = ticks[:7]
    steal = ticks[7] if len(ticks) > 7 else 0
    busy = user + nice + system + irq + softirq
    return busy / hz, steal / hz, (busy + idle + iowait + steal) / hz


def calibration_ms() -> float:
    """Wall milliseconds of a fixed piece of CPU-bound Python (the best of three)."""
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        d: dict = {}
        for i in range(300_000):
            d[i % 1000] = d.get(i % 1000, 0) + i * i
        best = min(best, time.perf_counter() - t)
    return best * 1000


def _own_cpu() -> float:
    """CPU seconds of this process and of the children it has waited for."""
    s = resource.getrusage(resource.RUSAGE_SELF)
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


class Watch:
    """Started at construction; :meth:`report` when the benchmark is done."""

    def __init__(self):
        self.load0 = os.getloadavg()[0]
        self.calibration0 = calibration_ms()
        self.t0 = time.perf_counter()
        self.cpu0 = _cpu_counters()
        self.own0 = _own_cpu()

    def report(self) -> dict:
        """``cpus``, ``load_average`` and ``calibration_ms`` [start, end], ``seconds``, and
        where /proc/stat is read, ``others_cpu_share`` (what other processes used, a share of
        all the CPUs' time) and ``steal_share`` (what the host took away)."""
        out = {"cpus": os.cpu_count(), "load_average": [self.load0, os.getloadavg()[0]],
               "seconds": time.perf_counter() - self.t0,
               "calibration_ms": [self.calibration0, calibration_ms()]}
        cpu1 = _cpu_counters()
        if self.cpu0 is not None and cpu1 is not None:
            busy, steal, total = (b - a for a, b in zip(self.cpu0, cpu1))
            own = _own_cpu() - self.own0
            if total > 0:
                out["others_cpu_share"] = max(0.0, busy - own) / total
                out["steal_share"] = steal / total
        return out


def describe(r: dict) -> str:
    """One line of :meth:`Watch.report`."""
    s = (f"machine: {r['cpus']} CPUs, load average {r['load_average'][0]:.2f} -> "
         f"{r['load_average'][1]:.2f}, a fixed Python task {r['calibration_ms'][0]:.0f} -> "
         f"{r['calibration_ms'][1]:.0f} ms")
    if "others_cpu_share" in r:
        s += (f"; other processes used {r['others_cpu_share']:.0%} of the CPUs' time, the "
              f"host took {r['steal_share']:.1%} (steal)")
    return s
