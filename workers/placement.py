"""Where the local scaler runs a model's workers: Triton's instance groups on this machine's
devices, as pure functions (no NVML, no processes; the tests feed them fake GPU lists).

Rules (Triton model_configuration.md, "Instance Groups"; one worker process is one instance):

- ``count`` instances per group; a count below 1 (unset) is 1.
- ``KIND_GPU`` with ``gpus: [0, 1]``: ``count`` instances on **each** listed GPU; without
  ``gpus``: ``count`` on each GPU of the machine. Groups on the same GPU add up.
- ``KIND_CPU``: ``count`` instances on the CPU.
- ``KIND_AUTO`` (the default kind): as ``KIND_GPU`` when the machine has a GPU, else as
  ``KIND_CPU``. ``KIND_MODEL`` (the model places itself) is treated as ``KIND_AUTO``.
- A ``KIND_GPU`` group with no GPU to run on (no ``pynvml``, no driver, no device, or none
  of its ``gpus`` on this machine) becomes a ``KIND_CPU`` group of the same ``count``, and
  :attr:`Slots.warning` says why, so the scaler warns once per model and the same
  repository runs in CI. A listed GPU that is missing while others exist is dropped with a
  warning too (Triton refuses such a config; Naiad serves on what there is).
- A config without ``instance_group`` sets no cap per device: its workers go to the GPUs if
  the machine has any, else to the CPU, as many as the scaling policy allows.

A GPU's count is a hard cap: the scaler never starts more of a model's workers on a GPU than
its groups give that GPU. The CPU's count only sets the model's worker maximum when the model
does not set ``naiad.max_workers`` (:func:`workers.scaling.policy_for`): CPU workers are
bounded by the policy, so a model may run more CPU workers than instances when it asks to.

GPU ids in a config are CUDA ordinals as this scaler sees them: positions in
:func:`visible_gpus` (NVML's PCI bus order, narrowed by the scaler's own
``CUDA_VISIBLE_DEVICES``). A device is named ``cpu`` or ``gpu:<NVML index>``; a worker on
``gpu:<i>`` runs with ``CUDA_VISIBLE_DEVICES=<i>`` and ``CUDA_DEVICE_ORDER=PCI_BUS_ID``
(:func:`worker_env`), so inside it that GPU is ``cuda:0``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from tritonclient.grpc import model_config_pb2 as mc

from naiad.host import GpuDevice

CPU = "cpu"
#: Environment variable telling a worker where it was placed (``Settings.device``).
DEVICE_ENV = "NAIAD_DEVICE"
_KIND = mc.ModelInstanceGroup


def gpu_device(index: int) -> str:
    """The device name of the GPU with NVML index ``index``."""
    return f"gpu:{index}"


@dataclass(frozen=True)
class Slots:
    """A model's instances on this machine: instances per device name (None: no count, for
    a config without ``instance_group``), and ``warning``: why some of its GPU instances run
    on the CPU or were dropped ("" when none)."""

    capacity: dict[str, int | None] = field(default_factory=dict)
    warning: str = ""

    @property
    def total(self) -> int | None:
        """Instances in all (the model's worker maximum), None when uncapped."""
        counts = list(self.capacity.values())
        return None if not counts or None in counts else sum(c or 0 for c in counts)


def visible_gpus(devices: Sequence[GpuDevice], cuda_visible_devices: str | None) -> list[GpuDevice]:
    """The GPUs this machine lets its processes use, in CUDA ordinal order: ``devices`` (NVML,
    every GPU), narrowed and ordered by ``CUDA_VISIBLE_DEVICES`` when set (indices or
    ``GPU-`` UUID prefixes, comma-separated; CUDA stops at the first token it cannot match,
    and so does this; empty: no GPU)."""
    if cuda_visible_devices is None:
        return list(devices)
    chosen: list[GpuDevice] = []
    for token in (t.strip() for t in cuda_visible_devices.split(",")):
        match = _match(devices, token)
        if match is None or match in chosen:
            break
        chosen.append(match)
    return chosen


def _match(devices: Sequence[GpuDevice], token: str) -> GpuDevice | None:
    if token.isdigit():
        return next((d for d in devices if d.index == int(token)), None)
    if token.startswith("GPU-"):
        found = [d for d in devices if d.uuid.startswith(token)]
        return found[0] if len(found) == 1 else None
    return None


def instance_slots(config: mc.ModelConfig | None, gpus: Sequence[GpuDevice]) -> Slots:
    """The :class:`Slots` of ``config`` on a machine with ``gpus`` (:func:`visible_gpus`)."""
    groups = list(config.instance_group) if config is not None else []
    if not groups:
        return Slots({gpu_device(g.index): None for g in gpus} if gpus else {CPU: None})
    capacity: dict[str, int | None] = {}
    warnings: list[str] = []
    for number, group in enumerate(groups):
        count = max(1, group.count)
        name = group.name or f"#{number}"
        devices, warning = _group_devices(group, gpus, name)
        if warning:
            warnings.append(warning)
        for device in devices:
            capacity[device] = (capacity.get(device) or 0) + count
    return Slots(capacity, "; ".join(warnings))


def _group_devices(
    group: mc.ModelInstanceGroup, gpus: Sequence[GpuDevice], name: str
) -> tuple[list[str], str]:
    """Devices one group's ``count`` goes on each of, and a warning ("" when none)."""
    if group.kind == _KIND.KIND_CPU or (group.kind != _KIND.KIND_GPU and not gpus):
        return [CPU], ""
    listed = list(group.gpus) or list(range(len(gpus)))
    present = [gpus[i].index for i in listed if 0 <= i < len(gpus)]
    missing = [i for i in listed if not 0 <= i < len(gpus)]
    if not present:
        why = f"gpus {missing} not on this machine ({len(gpus)} GPUs)" if gpus else "no GPU on this machine"
        return [CPU], f"instance group {name} asks for KIND_GPU but {why}: it runs on the CPU"
    warning = f"instance group {name}: gpus {missing} not on this machine, ignored" if missing else ""
    return [gpu_device(index) for index in present], warning


def choose(slots: Slots, gpus: Sequence[GpuDevice], placed: Mapping[str, int]) -> str | None:
    """The device for one more worker of a model, or None when every slot is taken.

    ``gpus``: the visible GPUs read now (their free memory); ``placed``: this model's
    workers already on each device. A GPU with a free slot comes first: the one holding
    fewest of this model's workers, then the most free memory, then the lowest index; then
    the CPU when the model has CPU instances (not capped here: see the module doc)."""
    memory = {gpu_device(g.index): g.memory_free_bytes for g in gpus}
    free = [d for d, cap in slots.capacity.items() if d == CPU or cap is None or placed.get(d, 0) < cap]
    on_gpu = sorted(
        (d for d in free if d in memory),
        key=lambda d: (placed.get(d, 0), -memory[d], int(d.partition(":")[2])),
    )
    if on_gpu:
        return on_gpu[0]
    return CPU if CPU in free else None


def worker_env(device: str, machine_has_gpu: bool) -> dict[str, str]:
    """Environment variables of a worker placed on ``device``: :data:`DEVICE_ENV`, and for
    a GPU ``CUDA_VISIBLE_DEVICES=<index>`` in PCI bus order; a CPU worker on a machine with
    GPUs sees none (``CUDA_VISIBLE_DEVICES=""``), so no framework takes GPU memory there."""
    env = {DEVICE_ENV: device}
    if device != CPU:
        env |= {"CUDA_VISIBLE_DEVICES": device.partition(":")[2], "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    elif machine_has_gpu:
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env
