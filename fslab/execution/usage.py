"""What a worker process uses, sampled at each heartbeat and written into
``status.json`` as ``usage``: CPU time as a percentage of wall time since the
last sample (over 100% when several threads work, as htop counts), resident
memory, and on CUDA the memory PyTorch has allocated and reserved and the GPU's
utilisation when the driver tells it. Standard library only; torch is asked
only if the training already imported it and initialised CUDA, so a CPU run
never touches CUDA and a missing driver or NVML costs a key, not the run."""

from __future__ import annotations

import os
import resource
import sys
import time


def resident_bytes() -> int | None:
    """Resident memory now (``/proc/self/statm``), else the peak (``getrusage``)."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def gpu_usage() -> dict:
    """Memory allocated and reserved on every visible GPU, and their mean
    utilisation: only where the training already set CUDA up."""
    torch = sys.modules.get("torch")
    if torch is None:
        return {}
    try:
        if not torch.cuda.is_available() or not torch.cuda.is_initialized():
            return {}
        devices = range(torch.cuda.device_count())
        usage = {"gpu_allocated_bytes": sum(int(torch.cuda.memory_allocated(d)) for d in devices),
                 "gpu_reserved_bytes": sum(int(torch.cuda.memory_reserved(d)) for d in devices)}
    except Exception:  # a driver gone wrong must not stop the heartbeat
        return {}
    try:  # needs NVML (pynvml); without it, memory only
        usage["gpu_utilization_percent"] = sum(float(torch.cuda.utilization(d)) for d in devices) / len(devices)
    except Exception:
        pass
    return usage


class UsageSampler:
    """``sample()``: this process's usage since the previous sample."""

    def __init__(self, clock=time.monotonic) -> None:
        self.clock = clock
        self._last = self._now()

    def _now(self) -> tuple[float, float]:
        times = os.times()
        return self.clock(), times.user + times.system

    def sample(self) -> dict:
        wall, cpu = self._now()
        last_wall, last_cpu = self._last
        self._last = wall, cpu
        usage: dict = {"time": time.time()}
        if wall > last_wall:
            usage["cpu_percent"] = round(100 * (cpu - last_cpu) / (wall - last_wall), 1)
        rss = resident_bytes()
        if rss is not None:
            usage["rss_bytes"] = rss
        usage.update(gpu_usage())
        return usage
