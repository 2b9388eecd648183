"""Readings of this machine's GPUs (NVML, through the optional ``nvidia-ml-py``) and CPU
(psutil), in the units Triton's metrics use: utilization as a ratio 0..1, bytes, watts.

Like Triton's, these describe the machine of the process that reads them (the gateway
answering the scrape), not the whole deployment. Without ``pynvml``, without a driver or
without a GPU, :class:`GpuReader` reads nothing, once decided and never raising. It is the one
place NVML is used: the gateway's ``nv_gpu_*`` metrics and the local scaler's placement of
workers (:mod:`workers.placement`) both read through it.
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import psutil

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class GpuReading:
    """One GPU now: its UUID, utilization (0..1), memory used and total (bytes), power (W)."""

    uuid: str
    utilization: float
    memory_used_bytes: int
    memory_total_bytes: int
    power_w: float


@dataclass(frozen=True)
class GpuDevice:
    """One GPU as placement sees it: its NVML index (PCI bus order), UUID, and memory free
    and total now (bytes)."""

    index: int
    uuid: str
    memory_free_bytes: int
    memory_total_bytes: int


@dataclass(frozen=True)
class CpuReading:
    """The machine's CPU utilization since the previous reading (0..1, all cores) and its
    memory: total and used (total - available, as Triton reads /proc/meminfo), bytes."""

    utilization: float
    memory_total_bytes: int
    memory_used_bytes: int


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class GpuReader:
    """Reads every GPU through NVML. ``nvml`` is the ``pynvml`` module (imported on first
    use when not given); if it is missing or ``nvmlInit`` fails, every call returns []."""

    def __init__(self, nvml: ModuleType | Any | None = None):
        self._nvml = nvml
        self._ready: bool | None = None
        #: Why NVML reads nothing ("" while it works or before the first read).
        self.problem = ""

    def _start(self) -> bool:
        if self._ready is None:
            try:
                self._nvml = self._nvml or importlib.import_module("pynvml")
                self._nvml.nvmlInit()
                self._ready = True
            except ImportError:
                self.problem = "pynvml is not installed (the 'gpu' extra: nvidia-ml-py)"
                self._ready = False
            except Exception as exc:  # no driver, no device: no GPU readings
                self.problem = f"NVML: {exc}"
                self._ready = False
            if not self._ready:
                logger.info("no GPU readings: %s", self.problem)
        return self._ready

    def devices(self) -> list[GpuDevice]:
        """Every GPU's index, UUID and memory now; [] without NVML, driver or GPU (then
        :attr:`problem` says why), never raising."""
        if not self._start():
            return []
        nvml = self._nvml
        try:
            found = []
            for index in range(nvml.nvmlDeviceGetCount()):
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                memory = nvml.nvmlDeviceGetMemoryInfo(handle)
                uuid = _text(nvml.nvmlDeviceGetUUID(handle))
                found.append(GpuDevice(index, uuid, int(memory.free), int(memory.total)))
        except Exception as exc:  # a device that fails now (reset, fallen off the bus)
            logger.warning("GPUs not read: %s", exc)
            self.problem = f"NVML: {exc}"
            return []
        self.problem = "" if found else "NVML finds no GPU"
        return found

    def __call__(self) -> list[GpuReading]:
        if not self._start():
            return []
        nvml = self._nvml
        try:
            handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
            return [self._read(nvml, handle) for handle in handles]
        except Exception as exc:  # a device that fails now (reset, fallen off the bus)
            logger.warning("GPU metrics not read: %s", exc)
            return []

    @staticmethod
    def _read(nvml: Any, handle: Any) -> GpuReading:
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        return GpuReading(
            uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
            utilization=nvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100.0,  # percent
            memory_used_bytes=int(memory.used),
            memory_total_bytes=int(memory.total),
            power_w=nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0,  # milliwatts
        )


def read_cpu() -> CpuReading:
    """The CPU and memory now (utilization: since the previous call in this process)."""
    memory = psutil.virtual_memory()
    utilization = psutil.cpu_percent(interval=None) / 100.0
    return CpuReading(utilization, memory.total, memory.total - memory.available)


def usable_cpus(cgroup_root: str = "/sys/fs/cgroup", proc_cgroup: str = "/proc/self/cgroup") -> int:
    """CPUs this process may use, at least 1: those it may run on (``sched_getaffinity``, which a
    pinning narrows), fewer where its cgroup or one above it grants less CPU time, in whole
    CPUs rounded down (a Kubernetes CPU limit, ``docker run --cpus``): cgroup v2 ``cpu.max``
    (``<quota> <period>`` µs, ``max`` for none;
    https://docs.kernel.org/admin-guide/cgroup-v2.html#cpu-interface-files) or v1
    ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` (-1 for none). What cannot be read counts as no
    limit."""
    count = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    quotas = [q for folder, top, read in _cgroup_folders(cgroup_root, proc_cgroup)
              for q in _up_to(folder, top, read)]  # fmt: skip
    return max(1, min(count, int(min(quotas))) if quotas else count)


def _cgroup_folders(root: str, proc_cgroup: str) -> list[tuple[str, str, Callable[[str], float | None]]]:
    """``(this process's cgroup folder, its hierarchy's mount, reader)`` for the v2 hierarchy
    and a v1 ``cpu`` one, from ``/proc/self/cgroup`` (``id:controllers:path`` lines)."""
    try:
        with open(proc_cgroup) as f:
            lines = [line.rstrip("\n").split(":", 2) for line in f]
    except OSError:
        lines = []
    found = []
    for parts in lines:
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":
            found.append((os.path.join(root, path.lstrip("/")), root, _cpu_max))
        elif "cpu" in controllers.split(","):
            top = os.path.join(root, controllers)
            found.append((os.path.join(top, path.lstrip("/")), top, _cfs_quota))
    return found or [(root, root, _cpu_max)]


def _up_to(folder: str, top: str, read: Callable[[str], float | None]) -> list[float]:
    """The limits ``read`` finds in ``folder`` and each folder above it up to ``top``."""
    found = []
    while True:
        quota = read(folder)
        if quota is not None:
            found.append(quota)
        if os.path.normpath(folder) == os.path.normpath(top) or len(folder) <= len(top):
            return found
        folder = os.path.dirname(os.path.normpath(folder))


def _cpu_max(folder: str) -> float | None:
    """A v2 ``cpu.max`` in CPUs; None for ``max`` or none readable."""
    try:
        with open(os.path.join(folder, "cpu.max")) as f:
            quota, period = (f.read().split() + ["100000"])[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError, ZeroDivisionError):
        return None


def _cfs_quota(folder: str) -> float | None:
    """A v1 ``cpu.cfs_quota_us`` over ``cpu.cfs_period_us`` in CPUs; None for -1 or none readable."""
    try:
        with open(os.path.join(folder, "cpu.cfs_quota_us")) as f:
            quota = int(f.read())
        with open(os.path.join(folder, "cpu.cfs_period_us")) as f:
            period = int(f.read())
        return None if quota <= 0 else quota / period
    except (OSError, ValueError, ZeroDivisionError):
        return None
