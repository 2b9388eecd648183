"""The Grafana dashboard (infra/grafana/naiad-dashboard.json): a Grafana 10 dashboard model
whose every PromQL query names only metrics a real ``naiad serve`` exports after real traffic."""

from __future__ import annotations

import json
import pathlib
import re

import numpy as np
import pytest
import tritonclient.http as httpclient
from prom_text import Scrape, parse

from gateway.metrics import GPU_GAUGES
from naiad.host import GpuReader

DASHBOARD = pathlib.Path(__file__).resolve().parents[2] / "infra" / "grafana" / "naiad-dashboard.json"

#: PromQL words that look like names but are not metrics (operators, modifiers).
KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring",
            "group_left", "group_right", "inf", "nan"}  # fmt: skip
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression: identifiers left once strings, label matchers,
    range selectors, grouping label lists and numbers are gone, that are neither a function
    or aggregation (followed by ``(``) nor a keyword."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)
    expr = re.sub(r"\{[^}]*\}", "", expr)
    expr = re.sub(r"\[[^\]]*\]", "", expr)
    expr = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    expr = re.sub(r"(?<![\w:])\d+(?:\.\d+)?(?:[eE][-+]?\d+)?(?:ms|[smhdwy])?", "", expr)  # 1e-9, 5m
    names = set()
    for match in re.finditer(r"[a-zA-Z_:][a-zA-Z0-9_:]*", expr):
        if expr[match.end():].lstrip().startswith("(") or match.group().lower() in KEYWORDS:
            continue
        names.add(match.group())
    return names


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def queried_names() -> set[str]:
    found = set()
    for panel in dashboard()["panels"]:
        for target in panel.get("targets", []):
            found |= metric_names(target["expr"])
    return found


def exported(name: str, scrape: Scrape) -> bool:
    """``name`` has samples in ``scrape``, as a family of its own or as a histogram's
    ``_bucket``/``_sum``/``_count`` series."""
    if name in scrape.types:
        return name in scrape.samples
    base = next((name[: -len(s)] for s in HISTOGRAM_SUFFIXES if name.endswith(s)), None)
    return scrape.types.get(base or "") == "histogram" and name in scrape.samples


def test_extractor():
    expr = ('histogram_quantile(0.99, max by (model, le) (rate(naiad_cold_start_seconds_bucket{model=~"$m"}'
            '[$__range]))) / on (model) group_left sum without (gpu) (x_total offset 5m) * 1e-9 > bool 0')
    assert metric_names(expr) == {"naiad_cold_start_seconds_bucket", "x_total"}
    assert metric_names("nv_gpu_utilization") == {"nv_gpu_utilization"}
    assert metric_names('label_values(up{job="a b"}, model)') == {"up", "model"}  # not used in targets


def test_dashboard_is_a_grafana_10_model():
    model = dashboard()
    assert model["schemaVersion"] >= 36 and model["uid"] and model["title"]
    ids = [panel["id"] for panel in model["panels"]]
    assert len(ids) == len(set(ids))
    for panel in model["panels"]:
        assert panel["type"] in {"timeseries", "stat", "gauge", "bargauge", "table"}
        assert panel["datasource"]["type"] == "prometheus"
        assert {"h", "w", "x", "y"} <= set(panel["gridPos"])
        assert panel["targets"] and all(t["expr"] and t["refId"] for t in panel["targets"])
    variables = {v["name"]: v for v in model["templating"]["list"]}
    assert variables["datasource"]["query"] == "prometheus"


@pytest.fixture(scope="module")
def scrape_after_traffic(example_repository, tmp_path_factory) -> Scrape:
    from naiad_harness import run_server

    with run_server(example_repository, tmp_path_factory.mktemp("dashboard")) as server:
        client = httpclient.InferenceServerClient(server.url, network_timeout=60)
        try:
            tensor = httpclient.InferInput("input", [2, 64], "FP32")
            tensor.set_data_from_numpy(np.ones((2, 64), np.float32))
            client.infer("digits", [tensor])  # a cold start, a download, a scaler decision
        finally:
            client.close()
        return parse(server.metrics())


def test_every_queried_metric_is_exported(scrape_after_traffic):
    names = queried_names()
    gpu = {n for n in names if n.startswith("nv_gpu_")}
    assert gpu <= set(GPU_GAUGES), gpu - set(GPU_GAUGES)
    missing = sorted(n for n in names - gpu if not exported(n, scrape_after_traffic))
    assert not missing, f"the dashboard queries metrics the server does not export: {missing}"
    assert {"nv_cache_num_hits_per_model", "naiad_cold_start_seconds_bucket", "naiad_model_workers"} <= names


def test_gpu_panels_query_exported_metrics_where_a_gpu_is(scrape_after_traffic):
    if not GpuReader()():
        pytest.skip("no GPU here (or no nvidia-ml-py): nv_gpu_* are exported only where NVML finds one")
    gpu = {n for n in queried_names() if n.startswith("nv_gpu_")}
    assert all(exported(n, scrape_after_traffic) for n in gpu)
