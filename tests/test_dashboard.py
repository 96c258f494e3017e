"""The Grafana dashboard shipped in hvdk8s/dashboards: it parses, asks only for metrics hvdk8s exports
(hvdk8s.metrics is the one list of them), reads every panel from the chosen data source, and has the
panels the README promises."""
import importlib.resources
import json
import re

import pytest

from hvdk8s.metrics import exported_names

DASHBOARD = importlib.resources.files("hvdk8s") / "dashboards" / "hvdk8s-training.json"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
# What may stand in an expression besides metric names: the PromQL functions, aggregations and keywords
# the dashboard uses or might reasonably use.
PROMQL = {"sum", "min", "max", "avg", "count", "stddev", "topk", "bottomk", "quantile", "rate", "irate", "increase",
          "delta", "idelta", "histogram_quantile", "clamp_min", "clamp_max", "abs", "time", "timestamp", "vector",
          "scalar", "avg_over_time", "max_over_time", "min_over_time", "by", "without", "on", "ignoring",
          "group_left", "group_right", "bool", "and", "or", "unless", "offset"}


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def exprs(dashboard) -> list[str]:
    return [t["expr"] for p in dashboard["panels"] for t in p["targets"]]


def identifiers(expr: str) -> set[str]:
    """The names an expression uses, less label matchers, grouping labels, ranges, variables and numbers."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)  # string literals
    expr = re.sub(r"\{[^}]*\}", "", expr)  # label matchers
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # ranges
    expr = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", r"\1", expr)  # label lists
    expr = re.sub(r"\$\w+", "", expr)
    return set(re.findall(r"(?<![\w.])[A-Za-z_:][\w:]*", expr))


def test_it_is_a_grafana_dashboard_with_a_prometheus_source_and_a_job_variable(dashboard):
    assert 36 <= dashboard["schemaVersion"] <= 41 and dashboard["uid"] == "hvdk8s-training"
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    job = variables["job"]
    assert job["datasource"] == DATASOURCE and job["definition"] == job["query"]["query"]
    assert re.fullmatch(r"label_values\((\w+), hvdk8s_job\)", job["definition"]).group(1) in exported_names()


def test_every_expression_uses_only_exported_metrics_and_promql(dashboard):
    names = exported_names()
    for expr in exprs(dashboard):
        used = identifiers(expr)
        metrics = {n for n in used if n.startswith("hvdk8s_")}
        assert metrics and metrics <= names, f"{expr}: not exported: {sorted(metrics - names)}"
        assert used - metrics <= PROMQL, f"{expr}: unknown names {sorted(used - metrics - PROMQL)}"
        assert 'hvdk8s_job="$job"' in expr, f"{expr}: not filtered to the chosen job"


def test_the_checker_catches_a_name_that_is_not_exported():
    used = identifiers('sum by (rank) (rate(hvdk8s_stpes_total{hvdk8s_job="$job"}[5m])) / node_cpu_seconds')
    assert used == {"sum", "by", "rate", "hvdk8s_stpes_total", "node_cpu_seconds"}
    assert "hvdk8s_stpes_total" not in exported_names()


def test_every_panel_reads_the_chosen_data_source(dashboard):
    for panel in dashboard["panels"]:
        assert panel["datasource"] == DATASOURCE, panel["title"]
        assert panel["targets"] and all(t["datasource"] == DATASOURCE for t in panel["targets"]), panel["title"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(set(ids)) == len(ids)


@pytest.mark.parametrize("title, metrics", [
    ("Throughput", {"hvdk8s_samples_per_second", "hvdk8s_samples_total"}),
    ("Step time per rank (p50, p95)", {"hvdk8s_step_seconds_bucket"}),
    ("Allreduce share of step time", {"hvdk8s_allreduce_wait_seconds_total", "hvdk8s_step_seconds_sum"}),
    ("Data-wait share of step time", {"hvdk8s_data_wait_seconds_total", "hvdk8s_step_seconds_sum"}),
    ("Loss per rank", {"hvdk8s_loss"}),
    ("Accuracy per rank", {"hvdk8s_accuracy"}),
    ("Epoch", {"hvdk8s_epoch"}),
    ("Seconds since checkpoint", {"hvdk8s_seconds_since_checkpoint"}),
    ("Per-rank skew", {"hvdk8s_step_seconds_sum", "hvdk8s_step_seconds_count", "hvdk8s_samples_per_second"}),
    ("Dataset cache files (last sync)", {"hvdk8s_cache_files_hit", "hvdk8s_cache_files_missed"}),
    ("Dataset cache bytes copied (last sync)", {"hvdk8s_cache_bytes_copied"}),
])
def test_the_panels_of_the_issue_exist(dashboard, title, metrics):
    panel = next((p for p in dashboard["panels"] if p["title"] == title), None)
    assert panel is not None, f"no panel {title!r}"
    used = set().union(*(identifiers(t["expr"]) for t in panel["targets"]))
    assert metrics <= used
