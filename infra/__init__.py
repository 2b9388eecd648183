"""Deployment beyond one machine: ``infra/k8s`` (Kubernetes manifests with KEDA), ``infra/grafana``
(the dashboard), and the per-model manifest rendering of ``naiad k8s render`` (:mod:`infra.render`)."""
