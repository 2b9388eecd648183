"""Kubernetes manifests: the shared ones in infra/k8s and the per-model ones `naiad k8s render`
writes. No cluster runs here and kubeconform is not installed (no network to fetch its
schemas): the tests check what Kubernetes and KEDA require by reading the manifests, and
build the kustomization with `kubectl kustomize` (offline) where kubectl is installed."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from infra.render import resource_name
from naiad import keys
from naiad_cli.commands import build_parser, main

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "infra" / "k8s"

GPU_MODEL = """
name: "gpu_model"
backend: "onnxruntime"
max_batch_size: 4
input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 2 ] } ]
instance_group [ { kind: KIND_GPU count: 1 } ]
parameters { key: "naiad.max_workers" value: { string_value: "7" } }
parameters { key: "naiad.target_inflight" value: { string_value: "3" } }
"""


def _docs(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def _check_objects(docs: list[dict]) -> None:
    for doc in docs:
        assert doc["apiVersion"] and doc["kind"] and doc["metadata"]["name"], doc
        if doc["kind"] == "Deployment":
            selector = doc["spec"]["selector"]["matchLabels"]
            pod_labels = doc["spec"]["template"]["metadata"]["labels"]
            assert selector.items() <= pod_labels.items()


@pytest.fixture
def rendered(tmp_path: Path, example_repository: Path) -> dict[str, list[dict]]:
    repository = Path(shutil.copytree(example_repository, tmp_path / "models"))
    (repository / "gpu_model" / "1").mkdir(parents=True)
    shutil.copy(repository / "digits" / "1" / "model.onnx", repository / "gpu_model" / "1" / "model.onnx")
    (repository / "gpu_model" / "config.pbtxt").write_text(GPU_MODEL)
    (repository / "broken").mkdir()  # no config, no version: skipped
    out = tmp_path / "out"
    assert main(["k8s", "render", "--model-repository", str(repository), "--out", str(out),
                 "--image-worker", "registry.example/naiad-worker:1", "--namespace", "ml"]) == 0
    files = sorted(out.glob("*.yaml"))
    assert len(files) == 3
    return {doc["metadata"]["annotations"]["naiad.io/model-name"]: _docs(path)
            for path in files for doc in _docs(path)[:1]}


def test_shared_manifests_parse_and_carry_what_kubernetes_needs() -> None:
    kinds = {}
    for path in sorted(K8S.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        docs = _docs(path)
        _check_objects(docs)
        kinds.update({(d["kind"], d["metadata"]["name"]): d for d in docs})
    assert {("Deployment", "naiad-gateway"), ("Service", "naiad-gateway"),
            ("HorizontalPodAutoscaler", "naiad-gateway"), ("Deployment", "redis"),
            ("Service", "redis")} <= set(kinds)
    service = kinds[("Service", "naiad-gateway")]
    assert sorted(p["port"] for p in service["spec"]["ports"]) == [8000, 8001, 8002]
    pods = kinds[("Deployment", "naiad-gateway")]["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pods.items()
    hpa = kinds[("HorizontalPodAutoscaler", "naiad-gateway")]["spec"]
    assert hpa["scaleTargetRef"]["name"] == "naiad-gateway"
    assert hpa["metrics"][0]["resource"]["name"] == "cpu"
    container = kinds[("Deployment", "naiad-gateway")]["spec"]["template"]["spec"]["containers"][0]
    assert build_parser().parse_args(container["args"]).command == "gateway"


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_kustomization_builds_offline() -> None:
    built = subprocess.run(["kubectl", "kustomize", str(K8S)], capture_output=True, text=True, timeout=60)
    assert built.returncode == 0, built.stderr
    assert len(list(yaml.safe_load_all(built.stdout))) >= 6


def test_rendered_worker_manifests(rendered: dict[str, list[dict]]) -> None:
    assert sorted(rendered) == ["digits", "gpu_model", "silero_vad"]
    for model, docs in rendered.items():
        _check_objects(docs)
        deployment, scaled = docs
        assert (deployment["kind"], scaled["kind"]) == ("Deployment", "ScaledObject")
        assert scaled["apiVersion"] == "keda.sh/v1alpha1"
        assert deployment["metadata"]["name"] == scaled["metadata"]["name"] == resource_name(model)
        assert deployment["metadata"]["namespace"] == "ml"
        spec = scaled["spec"]
        assert spec["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
        assert spec["minReplicaCount"] == 0
        triggers = spec["triggers"]
        assert {t["type"] for t in triggers} == {"redis-streams"}
        assert {t["metadata"]["stream"] for t in triggers} == {keys.request_stream(model)}
        assert any(t["metadata"].get("consumerGroup") == keys.WORKER_GROUP and "pendingEntriesCount"
                   in t["metadata"] for t in triggers)
        # The trigger that can wake a model at zero: XLEN (no consumer group).
        assert any("streamLength" in t["metadata"] and "consumerGroup" not in t["metadata"] for t in triggers)
        [container] = deployment["spec"]["template"]["spec"]["containers"]
        assert container["image"] == "registry.example/naiad-worker:1"
        env = {e["name"] for e in container["env"]}
        assert all(t["metadata"]["addressFromEnv"] in env for t in triggers)
        node = {"name": "NAIAD_RATE_LIMIT_HOST", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}
        assert node in container["env"]
        args = build_parser().parse_args(container["args"])
        assert (args.command, args.model) == ("worker", model)
        assert args.model_repository.endswith("models")
        # The Redis URL is never on the command line (ps, the pod spec's args): in the environment.
        assert getattr(args, "redis_url", None) is None
        assert not any("redis://" in a for a in container["args"])
        names = [e["name"] for e in container["env"]]
        assert names.index("REDIS_ADDRESS") < names.index("NAIAD_REDIS_URL")  # $(REDIS_ADDRESS) expands
        assert {"name": "NAIAD_REDIS_URL", "value": "redis://$(REDIS_ADDRESS)/0"} in container["env"]


def test_gpu_model_gets_a_gpu_and_its_scaling_parameters(rendered: dict[str, list[dict]]) -> None:
    deployment, scaled = rendered["gpu_model"]
    pod = deployment["spec"]["template"]["spec"]
    assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert pod["tolerations"][0]["key"] == "nvidia.com/gpu" and pod["nodeSelector"]
    assert scaled["spec"]["maxReplicaCount"] == 7
    assert {t["metadata"].get("streamLength") for t in scaled["spec"]["triggers"]} >= {"3"}
    cpu_pod = rendered["digits"][0]["spec"]["template"]["spec"]
    assert "nvidia.com/gpu" not in cpu_pod["containers"][0]["resources"]["limits"]
    assert "tolerations" not in cpu_pod and "nodeSelector" not in cpu_pod


def test_resource_names_are_dns_labels() -> None:
    for model in ("digits", "silero_vad", "Big.Model", "x" * 200):
        name = resource_name(model)
        assert len(name) <= 63 and name == name.lower() and name[0].isalnum() and name[-1].isalnum()
        assert all(ch.isalnum() or ch == "-" for ch in name)
    assert resource_name("a_b") != resource_name("a-b")


def test_a_redis_secret_gives_the_workers_url_from_its_url_key(tmp_path: Path, example_repository: Path):
    out = tmp_path / "out"
    assert main(["k8s", "render", "--model-repository", str(example_repository), "--out", str(out),
                 "--redis-secret", "naiad-redis"]) == 0
    for path in sorted(out.glob("*.yaml")):
        [container] = _docs(path)[0]["spec"]["template"]["spec"]["containers"]
        secret = {"secretKeyRef": {"name": "naiad-redis", "key": "url"}}
        url = {"name": "NAIAD_REDIS_URL", "valueFrom": secret}
        assert url in container["env"] and not any("redis" in a for a in container["args"])
