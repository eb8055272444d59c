"""A process's footprint from /proc: resident memory, CPU time, context switches."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ProcSample", "rss_parts_mb", "sample"]

_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class ProcSample:
    at_ns: int  # time.monotonic_ns() when taken
    cpu_ticks: int  # utime + stime from /proc/<pid>/stat, in clock ticks (every thread, exited ones too)
    cpu_ns: int  # the sum of every live thread's on-CPU time from /proc/<pid>/task/*/schedstat
    switches: int  # voluntary + involuntary context switches of every live thread

    def cpu_percent_ticks(self, later: ProcSample) -> float:
        wall = (later.at_ns - self.at_ns) / 1e9
        return 100.0 * (later.cpu_ticks - self.cpu_ticks) / _TICKS / wall

    def cpu_percent(self, later: ProcSample) -> float:
        return 100.0 * (later.cpu_ns - self.cpu_ns) / (later.at_ns - self.at_ns)

    def switches_per_s(self, later: ProcSample) -> float:
        return (later.switches - self.switches) / ((later.at_ns - self.at_ns) / 1e9)


def _stat_ticks(pid: int) -> int:
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2 :].split()
    return int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of proc(5))


def _threads(pid: int) -> list[Path]:
    return list(Path(f"/proc/{pid}/task").iterdir())


def sample(pid: int) -> ProcSample:
    cpu_ns = 0
    switches = 0
    for task in _threads(pid):
        try:
            cpu_ns += int((task / "schedstat").read_text().split()[0])
            for line in (task / "status").read_text().splitlines():
                if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                    switches += int(line.split()[1])
        except (FileNotFoundError, ProcessLookupError):
            continue  # a thread that just ended
    return ProcSample(time.monotonic_ns(), _stat_ticks(pid), cpu_ns, switches)


def rss_parts_mb(pid: int) -> dict[str, float]:
    """``VmRSS`` from /proc/<pid>/status and its parts (``RssAnon``, ``RssFile``, ``RssShmem``), in MiB.

    ``RssFile`` counts the mapped files' pages (Python, grpc's shared library) that are resident, which
    depends on the page cache as much as on the process: a library whose whole file is cached (just installed)
    has more pages mapped around each fault than one read from disk.
    """
    wanted = ("VmRSS", "RssAnon", "RssFile", "RssShmem")
    parts: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in wanted:
            parts[name] = int(value.split()[0]) / 1024.0
    missing = [name for name in wanted if name not in parts]
    if missing:
        raise RuntimeError(f"no {', '.join(missing)} in /proc/{pid}/status")
    return parts
