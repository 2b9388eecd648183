"""workers.placement: Triton's instance groups on fake GPU lists (no GPU here), and the
scaling policy's worker maximum that follows from them."""

from __future__ import annotations

import pytest

from naiad.host import GpuDevice
from naiad.settings import Settings
from repository_store import parse_config
from workers import placement, scaling
from workers.placement import CPU, Slots, choose, instance_slots, visible_gpus, worker_env

GIB = 1 << 30


def gpus(*free_gib: int) -> list[GpuDevice]:
    """GPUs with NVML indices 0, 1, ... and ``free_gib`` GiB free each (80 GiB cards)."""
    return [GpuDevice(i, f"GPU-{i}aaaa", free * GIB, 80 * GIB) for i, free in enumerate(free_gib)]


def config(groups: str = "", parameters: str = ""):
    text = (
        'name: "m" backend: "onnxruntime" max_batch_size: 4\n'
        'input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
    )
    if groups:
        text += f"instance_group [ {groups} ]\n"
    return parse_config(text + parameters, "m")


def test_kind_gpu_with_gpus_puts_count_on_each_listed_gpu():
    slots = instance_slots(config("{ kind: KIND_GPU count: 2 gpus: [ 0, 2 ] }"), gpus(10, 10, 10))
    assert slots == Slots({"gpu:0": 2, "gpu:2": 2})
    assert slots.total == 4


def test_kind_gpu_without_gpus_goes_on_every_gpu_and_groups_add_up():
    text = "{ kind: KIND_GPU count: 1 }, { kind: KIND_GPU count: 2 gpus: [ 1 ] }, { kind: KIND_CPU count: 3 }"
    assert instance_slots(config(text), gpus(10, 10)).capacity == {"gpu:0": 1, "gpu:1": 3, CPU: 3}


def test_a_count_left_unset_is_one():
    assert instance_slots(config("{ kind: KIND_CPU }"), []).capacity == {CPU: 1}


@pytest.mark.parametrize("kind", ["KIND_AUTO", "KIND_MODEL"])
def test_kind_auto_is_gpu_when_there_is_one_else_cpu(kind):
    assert instance_slots(config(f"{{ kind: {kind} count: 2 }}"), gpus(5)).capacity == {"gpu:0": 2}
    slots = instance_slots(config(f"{{ kind: {kind} count: 2 }}"), [])
    assert slots.capacity == {CPU: 2} and slots.warning == ""  # expected, so no warning


@pytest.mark.parametrize("gpu_list", [[], gpus(10)])
def test_kind_gpu_without_a_usable_gpu_falls_back_to_the_cpu_with_a_warning(gpu_list):
    groups = "{ name: \"g\" kind: KIND_GPU count: 2 gpus: [ 3 ] }"
    slots = instance_slots(config(groups), gpu_list)
    assert slots.capacity == {CPU: 2}
    assert "instance group g asks for KIND_GPU" in slots.warning and "runs on the CPU" in slots.warning


def test_a_missing_gpu_among_present_ones_is_dropped_with_a_warning():
    slots = instance_slots(config("{ kind: KIND_GPU count: 1 gpus: [ 0, 5 ] }"), gpus(10))
    assert slots.capacity == {"gpu:0": 1}
    assert "gpus [5] not on this machine" in slots.warning


def test_no_instance_group_sets_no_cap():
    assert instance_slots(config(), gpus(1, 2)) == Slots({"gpu:0": None, "gpu:1": None})
    assert instance_slots(config(), []).capacity == {CPU: None}
    assert instance_slots(None, []).total is None


def test_the_gpu_with_most_free_memory_is_chosen_then_the_least_loaded():
    slots = instance_slots(config("{ kind: KIND_GPU count: 2 }"), gpus(10, 30, 20))
    assert choose(slots, gpus(10, 30, 20), {}) == "gpu:1"
    # gpu:1 holds one of this model's workers: the next goes to the emptiest of the others
    assert choose(slots, gpus(10, 30, 20), {"gpu:1": 1}) == "gpu:2"
    assert choose(slots, gpus(10, 30, 20), {"gpu:0": 1, "gpu:1": 1, "gpu:2": 1}) == "gpu:1"


def test_a_full_gpu_is_never_given_another_worker():
    slots = instance_slots(config("{ kind: KIND_GPU count: 1 gpus: [ 0, 1 ] }"), gpus(10, 70))
    assert choose(slots, gpus(10, 70), {"gpu:1": 1}) == "gpu:0"
    assert choose(slots, gpus(10, 70), {"gpu:0": 1, "gpu:1": 1}) is None


def test_gpu_slots_come_before_cpu_ones_and_the_cpu_is_bounded_by_the_policy_only():
    slots = instance_slots(config("{ kind: KIND_GPU count: 1 }, { kind: KIND_CPU count: 1 }"), gpus(10))
    assert choose(slots, gpus(10), {}) == "gpu:0"
    assert choose(slots, gpus(10), {"gpu:0": 1}) == CPU
    assert choose(slots, gpus(10), {"gpu:0": 1, CPU: 4}) == CPU


def test_an_uncapped_model_spreads_over_every_gpu():
    slots = instance_slots(config(), gpus(40, 40))
    assert choose(slots, gpus(40, 40), {"gpu:0": 3}) == "gpu:1"
    assert choose(instance_slots(config(), []), [], {CPU: 9}) == CPU


def test_cuda_visible_devices_narrows_and_orders_the_gpus():
    every = gpus(1, 2, 3, 4)
    assert visible_gpus(every, None) == every
    assert [g.index for g in visible_gpus(every, "2,0")] == [2, 0]
    assert [g.index for g in visible_gpus(every, "GPU-3,1")] == [3, 1]
    assert visible_gpus(every, "") == [] and visible_gpus(every, "-1") == []
    assert [g.index for g in visible_gpus(every, "1,9,2")] == [1]  # CUDA stops at a bad token
    # the config's gpu ids are positions among the visible GPUs, placed by NVML index
    slots = instance_slots(config("{ kind: KIND_GPU count: 1 gpus: [ 0 ] }"), visible_gpus(every, "3"))
    assert slots.capacity == {"gpu:3": 1}


def test_worker_env_names_the_gpu_or_hides_every_gpu_from_a_cpu_worker():
    assert worker_env("gpu:3", True) == {placement.DEVICE_ENV: "gpu:3", "CUDA_VISIBLE_DEVICES": "3",
                                         "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}  # fmt: skip
    assert worker_env(CPU, True) == {placement.DEVICE_ENV: CPU, "CUDA_VISIBLE_DEVICES": ""}
    assert worker_env(CPU, False) == {placement.DEVICE_ENV: CPU}


def test_max_workers_follows_the_instance_groups_unless_the_model_sets_its_own():
    settings = Settings(max_workers_per_model=4)
    cpu2 = config("{ kind: KIND_CPU count: 2 }")
    assert scaling.policy_for(cpu2, settings, instance_slots(cpu2, []).total).max_workers == 2
    own = config("{ kind: KIND_CPU count: 2 }",
                 'parameters { key: "naiad.max_workers" value: { string_value: "3" } }')
    assert scaling.policy_for(own, settings, instance_slots(own, []).total).max_workers == 3
    plain = config()
    assert scaling.policy_for(plain, settings, instance_slots(plain, gpus(1)).total).max_workers == 4
    gpu = config("{ kind: KIND_GPU count: 2 }")
    assert scaling.policy_for(gpu, settings, instance_slots(gpu, gpus(1, 1, 1)).total).max_workers == 6
