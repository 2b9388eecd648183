"""``naiad k8s render``: per-model Kubernetes manifests from the model repository.

For each model the repository serves (READY, not an ensemble: ensembles run in the gateway),
one file ``<name>.yaml`` with

- a worker ``Deployment`` running ``naiad worker --model NAME --model-repository ...`` (the
  command the local scaler starts), the Redis URL in ``NAIAD_REDIS_URL`` (never on the
  command line, which ``ps`` and the pod spec's ``args`` show: from a Secret's ``url`` key
  with ``--redis-secret``, else ``redis://$(REDIS_ADDRESS)/0``; the worker takes it out of
  its environment before any model code runs), with CPU/memory
  requests, and for a config whose ``instance_group`` asks for ``KIND_GPU`` one
  ``nvidia.com/gpu``, a GPU node selector and the GPU taint's toleration;
- a KEDA ``ScaledObject`` (``keda.sh/v1alpha1``) scaling it 0..N on the model's Redis streams
  (:func:`naiad.keys.request_streams`, one per priority level), ``minReplicaCount: 0``,
  ``maxReplicaCount`` from the
  model's ``naiad.max_workers`` parameter (else its ``instance_group`` counts, one GPU per
  pod: :mod:`workers.placement`; else the server default), the per-replica target
  from ``naiad.target_inflight`` and the cool-down from ``naiad.idle_timeout_s`` — read
  through :func:`workers.scaling.policy_for`, the local scaler's own policy.

Two ``redis-streams`` triggers. KEDA's pending-entries trigger (``consumerGroup`` +
``pendingEntriesCount``) counts only entries delivered to a consumer and not yet
acknowledged (``XPENDING``), which stays 0 while no worker reads: alone, it would never wake
a model at zero (KEDA reports a trigger active when its count is > 0). The stream-length
trigger (``XLEN``, no ``consumerGroup``) is what wakes it: Naiad deletes each answered entry,
so the stream's length is the model's backlog, queued plus in flight.

The worker's own idle exit would make Kubernetes restart its container, so the rendered
worker runs with a very long ``--idle-timeout``: KEDA's cool-down takes the model to zero.
A model whose config sets ``naiad.idle_timeout_s`` overrides that flag in the worker.
"""

from __future__ import annotations

import hashlib
import logging
import re
from dataclasses import dataclass
from pathlib import Path

import yaml
from tritonclient.grpc import model_config_pb2 as mc

from naiad import keys, queue_policy
from naiad.procs import REDIS_URL_ENV
from naiad.settings import Settings

logger = logging.getLogger(__name__)

WORKER_LABEL = "naiad-worker"
MODEL_LABEL = "naiad.io/model"
MODEL_ANNOTATION = "naiad.io/model-name"
CACHE_DIR = "/var/cache/naiad/models"
#: Seconds a rendered worker waits idle before it exits on its own: a year (KEDA scales to 0).
K8S_IDLE_TIMEOUT_S = 365 * 24 * 3600
GPU_RESOURCE = "nvidia.com/gpu"
#: Label NVIDIA's GPU feature discovery puts on nodes with a GPU.
GPU_NODE_LABEL = "nvidia.com/gpu.present"
S3_SECRET = "naiad-s3"
_DNS = re.compile(r"[^a-z0-9-]+")


@dataclass(frozen=True)
class RenderOptions:
    """What the manifests need besides the model: images, namespace, where Redis and the
    repository are (the Redis address as KEDA wants it, ``host:port``)."""

    repository: str
    image_worker: str = "naiad-worker:latest"
    namespace: str = "naiad"
    redis_address: str = "redis:6379"
    redis_secret: str = ""
    """A Secret whose ``url`` key holds the workers' Redis URL (with its password); empty:
    ``redis://<redis_address>/0``, no password."""


def resource_name(model: str) -> str:
    """A DNS-1123 name for ``model``'s objects (``naiad-worker-<model>``, lower case, other
    characters as '-', cut to 63 with a hash when the model name does not fit as is)."""
    slug = _DNS.sub("-", model.lower()).strip("-") or "model"
    name = f"{WORKER_LABEL}-{slug}"
    if name != f"{WORKER_LABEL}-{model}" or len(name) > 63:
        suffix = hashlib.sha256(model.encode()).hexdigest()[:8]
        name = f"{name[:54].rstrip('-')}-{suffix}"
    return name


def uses_gpu(config: mc.ModelConfig) -> bool:
    """True when an ``instance_group`` of the config asks for ``KIND_GPU``."""
    return any(group.kind == mc.ModelInstanceGroup.KIND_GPU for group in config.instance_group)


def worker_args(model: str, options: RenderOptions) -> list[str]:
    """``naiad`` arguments of a model's worker container (the Redis URL is in its
    environment: :func:`redis_url_env`)."""
    return [
        "worker", "--model", model,
        "--model-repository", options.repository,
        "--cache-dir", CACHE_DIR,
        "--idle-timeout", str(K8S_IDLE_TIMEOUT_S),
    ]  # fmt: skip


def redis_url_env(options: RenderOptions) -> dict:
    """The worker container's ``NAIAD_REDIS_URL``: from ``options.redis_secret``'s ``url``
    key, else built from ``$(REDIS_ADDRESS)`` (Kubernetes expands it from the variable defined
    before it in the container's ``env``)."""
    if options.redis_secret:
        secret = {"name": options.redis_secret, "key": "url"}
        return {"name": REDIS_URL_ENV, "valueFrom": {"secretKeyRef": secret}}
    return {"name": REDIS_URL_ENV, "value": "redis://$(REDIS_ADDRESS)/0"}


def render_model(config: mc.ModelConfig, options: RenderOptions, settings: Settings) -> list[dict]:
    """The Deployment and ScaledObject of one model, as plain dicts."""
    from workers.placement import instance_slots  # noqa: PLC0415 (the scaler's own rules)
    from workers.scaling import policy_for  # noqa: PLC0415

    policy = policy_for(config, settings, instance_slots(config, []).total)
    name = resource_name(config.name)
    labels = {"app.kubernetes.io/name": WORKER_LABEL, "app.kubernetes.io/part-of": "naiad",
              MODEL_LABEL: name.removeprefix(f"{WORKER_LABEL}-")}
    metadata = {"name": name, "namespace": options.namespace, "labels": labels,
                "annotations": {MODEL_ANNOTATION: config.name}}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata,
        "spec": {
            "replicas": 0,  # KEDA owns the count
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels, "annotations": {MODEL_ANNOTATION: config.name}},
                         "spec": _pod_spec(config, options)},
        },
    }
    scaled = {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": metadata,
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
            "minReplicaCount": 0,
            "maxReplicaCount": policy.max_workers,
            "pollingInterval": 5,
            "cooldownPeriod": max(1, round(policy.idle_timeout_s)),
            "triggers": _triggers(queue_policy.streams(config.name, config), policy.target_inflight),
        },
    }
    return [deployment, scaled]


def _triggers(streams: list[str], target: int) -> list[dict]:
    """Two triggers per request stream (one per priority level): its length and its
    group's pending entries. KEDA scales on the largest, not on their sum."""
    return [trigger for stream in streams for trigger in (
        {"type": "redis-streams",
         "metadata": {"addressFromEnv": "REDIS_ADDRESS", "stream": stream, "streamLength": str(target)}},
        {"type": "redis-streams",
         "metadata": {"addressFromEnv": "REDIS_ADDRESS", "stream": stream,
                      "consumerGroup": keys.WORKER_GROUP, "pendingEntriesCount": str(target)}},
    )]  # fmt: skip


def _pod_spec(config: mc.ModelConfig, options: RenderOptions) -> dict:
    resources = {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "4Gi"}}
    spec: dict = {
        "terminationGracePeriodSeconds": 60,  # SIGTERM: finish the batch, acknowledge, exit
        "containers": [{
            "name": "worker",
            "image": options.image_worker,
            "command": ["naiad"],
            "args": worker_args(config.name, options),
            "env": [
                {"name": "REDIS_ADDRESS", "value": options.redis_address},
                redis_url_env(options),
                # The rate limiter's machine is the node: the workers of one node share it.
                {"name": "NAIAD_RATE_LIMIT_HOST", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            ],
            "envFrom": [{"secretRef": {"name": S3_SECRET, "optional": True}}],
            "resources": resources,
            "volumeMounts": [{"name": "model-cache", "mountPath": CACHE_DIR}],
        }],
        "volumes": [{"name": "model-cache", "emptyDir": {}}],
    }  # fmt: skip
    if uses_gpu(config):
        resources["limits"][GPU_RESOURCE] = 1
        spec["nodeSelector"] = {GPU_NODE_LABEL: "true"}
        spec["tolerations"] = [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}]
    return spec


class _PlainDumper(yaml.SafeDumper):
    """Writes repeated dicts (the labels) out in full: no ``&id``/``*id`` aliases."""

    def ignore_aliases(self, data) -> bool:
        return True


def dump(documents: list[dict]) -> str:
    """``documents`` as one multi-document YAML text, keys in the order given."""
    return yaml.dump_all(documents, Dumper=_PlainDumper, sort_keys=False)


def render_repository(options: RenderOptions, out: Path, settings: Settings) -> dict[str, Path]:
    """Write ``out/<resource name>.yaml`` for every READY non-ensemble model of
    ``options.repository``; returns model name -> file. Unavailable models are skipped with a
    warning. Raises RepositoryError if the repository cannot be read."""
    from repository_store import backend_of, index_repository, open_store  # noqa: PLC0415

    store = open_store(options.repository)
    store.check()
    out.mkdir(parents=True, exist_ok=True)
    written = {}
    for name, entry in index_repository(store).items():
        if not entry.ready or entry.config is None:
            logger.warning("model '%s' skipped: %s", name, entry.reason)
            continue
        if backend_of(entry.config) == "ensemble":
            continue
        path = out / f"{resource_name(name)}.yaml"
        path.write_text(dump(render_model(entry.config, options, settings)))
        written[name] = path
    return written
