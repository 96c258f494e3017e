"""Prometheus metrics: each rank's series, served per node by its first rank, scraped by a real
Prometheus server (Debian's package, installed by scripts/setup.sh) from real 2-rank jobs."""
import json
import math
import os
import shutil
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request

import pytest
import yaml

from conftest import DIGITS_JOB, cli, events_of, rank_results, run_ranks
from hvdk8s import metrics
from hvdk8s.data import cache
from hvdk8s.data.cache.layout import DatasetDir
from test_cache_launch import digits_over_http  # noqa: F401  (a fixture: digits served over HTTP)
from test_observability_files import EPOCHS, check_epoch_scalars

pytestmark = pytest.mark.ranks
SCRAPE_S = 0.5


def free_port(span: int = 1) -> int:
    """A port p with p..p+span-1 free now (the node's ranks use port + local rank)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            p = s.getsockname()[1]
        if p + span <= 65535 and all(_free(p + i) for i in range(1, span)):
            return p
    raise RuntimeError("no free ports")


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_a_users_script_serves_both_ranks_on_the_first_ranks_port(tmp_path):
    port = free_port(2)
    run_ranks("metrics_rank.py", tmp_path, port)
    scraped = rank_results(tmp_path)[0]["samples"]
    for r in ("0", "1"):
        assert scraped["hvdk8s_steps_total"][r + "|"] == 5
        assert scraped["hvdk8s_samples_total"][r + "|"] == 5 * (4 + int(r))
        assert scraped["hvdk8s_step_seconds_count"][r + "|"] == 5
        assert scraped["hvdk8s_step_seconds_bucket"][r + "|+Inf"] == 5
        assert scraped["hvdk8s_loss"][r + "|"] == 0.25 + int(r)
        assert scraped["hvdk8s_epoch"][r + "|"] == 1
        assert scraped["hvdk8s_allreduce_wait_seconds_total"][r + "|"] > 0  # distribute's synchronize, timed
        assert scraped["hvdk8s_data_wait_seconds_total"][r + "|"] >= 0
        assert 0 <= scraped["hvdk8s_seconds_since_checkpoint"][r + "|"] < 60
    assert set(scraped) <= metrics.exported_names()


def test_a_rank_waits_for_its_first_scrape_then_starts():
    m = metrics.Metrics(job="j", rank=0)
    m.serve(free_port(), local_rank=0, local_size=1, address="127.0.0.1")
    try:
        assert m.await_first_scrape(0.05) is False  # nobody scraped it: the bound ends the wait
        waited: list[bool] = []
        rank = threading.Thread(target=lambda: waited.append(m.await_first_scrape(300)))
        rank.start()
        with urllib.request.urlopen(f"http://127.0.0.1:{m.server.server_port}/metrics", timeout=10) as r:
            assert "hvdk8s_steps_total" in r.read().decode()
        rank.join(60)
        assert waited == [True]
        assert metrics.Metrics(enabled=False).await_first_scrape(300) is False  # off: no wait at all
    finally:
        m.close()


def test_the_last_sync_of_a_cached_dataset_is_recorded_for_the_ranks(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(3):
        (src / f"f{i}").write_bytes(b"x" * (10 + i))
    first = cache.sync(str(src), tmp_path / "cache")
    assert DatasetDir(tmp_path / "cache", first.key).read_last_sync() == {"files_hit": 0, "files_missed": 3,
                                                                         "bytes_copied": 33}
    (src / "f0").write_bytes(b"y" * 5)
    cache.sync(str(src), tmp_path / "cache")
    assert DatasetDir(tmp_path / "cache", first.key).read_last_sync() == {"files_hit": 2, "files_missed": 1,
                                                                         "bytes_copied": 5}


def test_a_metrics_port_in_use_stops_the_job_naming_the_field(job_file):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        run = cli("launch", "--local", "-np", "2", "--log-format", "json",
                  job_file({"observability": {"metrics": {"enabled": True, "port": port}},
                            "training": {"epochs": 1}}), timeout=120)
    out = run.stdout + run.stderr
    assert run.returncode == 2  # refused before any rank starts
    assert "observability.metrics.port" in out and str(port) in out and "in use" in out
    assert "Traceback" not in out and events_of(run.stdout, "start", "epoch") == [], out


# --- a real Prometheus ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    """Prometheus on loopback, scraping one metrics port (the jobs' first rank) every SCRAPE_S seconds."""
    binary = shutil.which("prometheus")
    if binary is None:
        if os.environ.get("CI"):
            pytest.fail("prometheus is not installed: scripts/setup.sh installs Debian's package")
        pytest.skip("prometheus is not installed: scripts/setup.sh installs Debian's package")
    tmp = tmp_path_factory.mktemp("prometheus")
    target, web = free_port(2), free_port()
    every = f"{round(SCRAPE_S * 1000)}ms"  # Prometheus durations are whole numbers of a unit
    config = {"global": {"scrape_interval": every, "scrape_timeout": every},
              "scrape_configs": [{"job_name": "hvdk8s", "static_configs": [{"targets": [f"127.0.0.1:{target}"]}]}]}
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
    log = open(tmp / "prometheus.log", "w")
    proc = subprocess.Popen([binary, f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'data'}",
                             f"--web.listen-address=127.0.0.1:{web}"], stdout=log, stderr=subprocess.STDOUT)
    api = f"http://127.0.0.1:{web}"
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(f"{api}/-/ready", timeout=2) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        assert proc.poll() is None, (tmp / "prometheus.log").read_text()
        assert time.monotonic() < deadline, "Prometheus was not ready within 60 s"
        time.sleep(0.2)
    yield api, target
    proc.terminate()
    proc.wait(30)
    log.close()


def query(api: str, promql: str) -> list[dict]:
    url = f"{api}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=10) as r:
        body = json.load(r)
    assert body["status"] == "success", body
    return body["data"]["result"]


def by_rank(result: list[dict]) -> dict[str, float]:
    return {s["metric"]["rank"]: float(s["value"][1]) for s in result}


def launch_scraped(job: dict, tmp_path, env: dict | None = None) -> tuple[float, float, str]:
    """Run the job on 2 local ranks, held at its end until Prometheus has stored its final values (however
    fast the machine trains it); returns when it ran (Unix times) and its records (`--log-format json`: read
    with events_of)."""
    # Bounds only: the ranks start once their zero counts are scraped (the rates' baseline) and end once
    # their final values are.
    job["observability"]["metrics"].update(first_scrape_timeout_seconds=300, final_scrape_timeout_seconds=300)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    began = time.time()
    run = cli("launch", "--local", "-np", "2", "--log-format", "json", path, env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    return began, time.time(), run.stdout


def dashboard_exprs() -> list[str]:
    import importlib.resources

    board = json.loads((importlib.resources.files("hvdk8s") / "dashboards" / "hvdk8s-training.json").read_text())
    return [t["expr"] for p in board["panels"] for t in p["targets"]]


def query_range(api: str, promql: str, began: float, ended: float) -> list[dict]:
    url = f"{api}/api/v1/query_range?" + urllib.parse.urlencode(
        {"query": promql, "start": began, "end": ended, "step": SCRAPE_S})
    with urllib.request.urlopen(url, timeout=10) as r:
        body = json.load(r)
    assert body["status"] == "success", (promql, body)
    return body["data"]["result"]


@pytest.mark.parametrize("framework", ["pytorch", "tensorflow"])
def test_prometheus_scrapes_samples_per_second_loss_and_step_time_of_each_rank(prometheus, framework, tmp_path,
                                                                                digits_over_http):  # noqa: F811
    api, port = prometheus
    name = f"digits-{framework}"
    job = yaml.safe_load(DIGITS_JOB.read_text())
    job.update(name=name, framework=framework,
               observability={"metrics": {"enabled": True, "port": port},
                              "dir": str(tmp_path / "run")})
    env = None
    if framework == "pytorch":  # a cached dataset: the ranks also export what the node's sync did
        job["dataset"] = {"path": digits_over_http[0], "version": "v1"}
        env = {"HVDK8S_CACHE_DIR": str(tmp_path / "cache")}
    if framework == "tensorflow":  # one launch for two checks: TensorBoard's scalars of a Keras run too
        job["observability"]["tensorboard"] = True
        job["training"].update(epochs=EPOCHS, warmup_epochs=2)
    else:
        job["training"]["epochs"] = 2  # shorter than a scrape interval on a fast machine: the hold is what counts
    began, ended, out = launch_scraped(job, tmp_path, env)
    if framework == "tensorflow":
        run_dir = tmp_path / "run"
        check_epoch_scalars(run_dir, events_of(out, "epoch"))
        assert sorted(p.name for p in run_dir.iterdir()) == ["tensorboard"]  # nothing it was not asked for
    sel, window = f'{{hvdk8s_job="{name}"}}', "[10m]"

    throughput = by_rank(query(api, f"max_over_time(hvdk8s_samples_per_second{sel}{window})"))
    assert set(throughput) == {"0", "1"} and all(v > 0 for v in throughput.values()), throughput
    loss = by_rank(query(api, f"last_over_time(hvdk8s_loss{sel}{window})"))
    assert set(loss) == {"0", "1"} and all(0 < v < 3 and math.isfinite(v) for v in loss.values()), loss
    steps = by_rank(query(api, f"max_over_time(hvdk8s_step_seconds_count{sel}{window})"))
    assert set(steps) == {"0", "1"} and all(v > 0 for v in steps.values()), steps
    step_time = by_rank(query(api, f"max_over_time(hvdk8s_step_seconds_sum{sel}{window}) / "
                                   f"max_over_time(hvdk8s_step_seconds_count{sel}{window})"))
    assert all(0 < v < 5 for v in step_time.values()), step_time
    # Every rank reads half the samples of an epoch (1437 training digits): never more than that.
    seen = by_rank(query(api, f"max_over_time(hvdk8s_samples_total{sel}{window})"))
    assert all(0 < v <= 719 * job["training"]["epochs"] for v in seen.values()), seen
    if framework == "pytorch":
        waits = by_rank(query(api, f"max_over_time(hvdk8s_allreduce_wait_seconds_total{sel}{window})"))
        assert set(waits) == {"0", "1"} and all(v > 0 for v in waits.values()), waits
        missed = by_rank(query(api, f"max_over_time(hvdk8s_cache_files_missed{sel}{window})"))
        assert set(missed) == {"0", "1"} and all(v > 0 for v in missed.values()), missed
        # Grafana's dashboard, as Grafana would ask for it over the run: every panel's query is valid
        # PromQL and draws something.
        for expr in dashboard_exprs():
            promql = expr.replace("$job", name).replace("$__rate_interval", "2s")
            series = query_range(api, promql, began, ended)
            assert any(not math.isnan(float(v)) for s in series for _, v in s["values"]), promql
