"""naiad.host: GPU readings through NVML's Python API (a fake module stands in for pynvml
at that boundary: no GPU here) and CPU readings through psutil."""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace

from naiad.host import CpuReading, GpuDevice, GpuReader, GpuReading, read_cpu


class FakeNvml:
    """pynvml's functions as this module calls them, answering for two GPUs."""

    def __init__(self, fail_init: bool = False):
        self.fail_init = fail_init
        self.inits = 0

    def nvmlInit(self) -> None:
        self.inits += 1
        if self.fail_init:
            raise RuntimeError("NVML Shared Library Not Found")

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetUUID(self, handle: int):
        return f"GPU-{handle}" if handle else b"GPU-0"  # older pynvml returns bytes

    def nvmlDeviceGetUtilizationRates(self, handle: int):
        return SimpleNamespace(gpu=[37, 100][handle], memory=5)

    def nvmlDeviceGetMemoryInfo(self, handle: int):
        return SimpleNamespace(total=80 << 30, used=[1 << 30, 3 << 30][handle], free=0)

    def nvmlDeviceGetPowerUsage(self, handle: int) -> int:
        return [71_500, 300_000][handle]  # milliwatts


def test_nvml_readings_convert_to_tritons_units():
    assert GpuReader(FakeNvml())() == [
        GpuReading("GPU-0", 0.37, 1 << 30, 80 << 30, 71.5),
        GpuReading("GPU-1", 1.0, 3 << 30, 80 << 30, 300.0),
    ]


def test_no_nvml_reads_nothing_and_tries_once():
    nvml = FakeNvml(fail_init=True)
    reader = GpuReader(nvml)
    assert reader() == [] and reader() == []
    assert nvml.inits == 1


def test_devices_for_placement_give_index_uuid_and_memory():
    assert GpuReader(FakeNvml()).devices() == [
        GpuDevice(0, "GPU-0", 0, 80 << 30),
        GpuDevice(1, "GPU-1", 0, 80 << 30),
    ]


def test_no_devices_say_why():
    reader = GpuReader(FakeNvml(fail_init=True))
    assert reader.devices() == []
    assert reader.problem == "NVML: NVML Shared Library Not Found"


def test_this_machine_reads_its_gpus_without_raising():
    """On this machine, with or without pynvml and a driver: a reading never raises; no GPU
    means [] with the reason said, a GPU means one reading per device NVML lists."""
    reader = GpuReader()
    readings = reader()
    if readings:
        assert reader.problem == "" and len(readings) == len(reader.devices())
    elif reader.problem:  # no pynvml, or NVML without a driver (this CPU machine)
        expected = "NVML: " if importlib.util.find_spec("pynvml") else "pynvml is not installed"
        assert reader.problem.startswith(expected), reader.problem
    else:  # a driver that lists no GPU
        assert reader.devices() == []


def test_cpu_reading_is_in_range():
    read_cpu()
    reading = read_cpu()
    assert isinstance(reading, CpuReading)
    assert 0.0 <= reading.utilization <= 1.0
    assert 0 < reading.memory_used_bytes < reading.memory_total_bytes
