"""Prometheus metrics of a training job, one set of series per rank.

Every series carries `hvdk8s_job` (the job's name) and `rank`, so that one slow rank or node shows up as
skew between series. The first rank of each node serves all of the node's ranks on the job's metrics
port: the others serve on loopback only (port + local rank) and the first merges what they serve into
its own answer, so a pod, whatever its slots, is one scrape target on one port (what the
`prometheus.io/port` annotation and a PodMonitor name).

`METRICS` is the one list of what is exported; the Grafana dashboard may use only these names (a test
checks it). Recording is cheap and does nothing when metrics are off: the trainer records
unconditionally, and so may users' scripts (`hvdk8s.torch.metrics()`, `hvdk8s.tensorflow.metrics()`).
"""
from __future__ import annotations

import os
import threading
import time
import urllib.request
from typing import Any, Callable, Iterable, Iterator, Optional

from hvdk8s.core.errors import UserError

PREFIX = "hvdk8s_"
LABELS = ("hvdk8s_job", "rank")
# name -> (type, help). Counters are exported as NAME (ending in _total), histograms as NAME_bucket,
# NAME_sum and NAME_count.
METRICS: dict[str, tuple[str, str]] = {
    "hvdk8s_steps_total": ("counter", "training steps (backward passes) this rank has run"),
    "hvdk8s_samples_total": ("counter", "training samples this rank has read"),
    "hvdk8s_samples_per_second": ("gauge", "this rank's training throughput over the last few seconds"),
    "hvdk8s_step_seconds": ("histogram", "wall time from one training step to the next, waits included"),
    "hvdk8s_allreduce_wait_seconds_total": ("counter", "time steps spent waiting for the gradients' allreduce "
                                                       "(PyTorch; a Keras step reduces inside its graph)"),
    "hvdk8s_data_wait_seconds_total": ("counter", "time steps spent waiting for the next batch (PyTorch "
                                                  "loaders; Keras reads inside model.fit)"),
    "hvdk8s_loss": ("gauge", "this rank's mean training loss over the epoch so far"),
    "hvdk8s_accuracy": ("gauge", "this rank's training accuracy over the epoch so far"),
    "hvdk8s_epoch": ("gauge", "the epoch being trained"),
    "hvdk8s_seconds_since_checkpoint": ("gauge", "seconds since the job's last checkpoint (or since this rank "
                                                 "started, before the first)"),
    "hvdk8s_cache_files_hit": ("gauge", "files of the dataset that the node's last cache sync found in place"),
    "hvdk8s_cache_files_missed": ("gauge", "files of the dataset that the node's last cache sync copied"),
    "hvdk8s_cache_bytes_copied": ("gauge", "bytes that the node's last cache sync of the dataset copied"),
}
STEP_BUCKETS = (.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
GAUGE_EVERY_S = 1.0  # loss, accuracy and throughput are read (a host sync on a GPU) at most this often
PEER_TIMEOUT_S = 2.0
ADDRESS_ENV = "HVDK8S_METRICS_ADDRESS"  # where the node's first rank listens (default all interfaces)


def exported_names() -> set[str]:
    """Every sample name a scrape can show."""
    names = set()
    for name, (kind, _) in METRICS.items():
        names |= {name + s for s in ("_bucket", "_sum", "_count")} if kind == "histogram" else {name}
    return names


class Metrics:
    """One rank's metrics; every method is a no-op when `enabled` is False."""

    def __init__(self, job: str = "", rank: int = 0, enabled: bool = True):
        self.enabled = enabled
        self.registry = None
        self.server = None
        self._mark = self._last_gauges = time.perf_counter()
        self._since_checkpoint = time.time()
        self._samples_at_gauges = 0
        self._samples = 0
        self._loss = self._accuracy = None  # the latest step's readers, for the epoch's final gauges
        self._first_on_node = True
        self._served = 0  # answers this rank's endpoint has begun: scrapes (first rank) or reads by it
        self._served_at_flush = 0
        self._served_changed = threading.Condition()
        if not enabled:
            return
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry(auto_describe=True)
        kinds = {"counter": Counter, "gauge": Gauge}
        labels = {"hvdk8s_job": job, "rank": str(rank)}
        m = {}
        for name, (kind, help_text) in METRICS.items():
            if kind == "histogram":
                metric = Histogram(name, help_text, LABELS, registry=self.registry, buckets=STEP_BUCKETS)
            else:
                metric = kinds[kind](name, help_text, LABELS, registry=self.registry)
            m[name] = metric.labels(**labels)
        self._m = m
        for name in ("hvdk8s_samples_per_second", "hvdk8s_loss", "hvdk8s_accuracy"):
            m[name].set(float("nan"))  # not known yet (0 would read as a value)
        m["hvdk8s_seconds_since_checkpoint"].set_function(lambda: time.time() - self._since_checkpoint)

    # --- what a training loop records ------------------------------------------------------------
    def begin_epoch(self, epoch: int) -> None:
        """Call before an epoch's first step: the next step's time is counted from here."""
        if self.enabled:
            self._m["hvdk8s_epoch"].set(epoch)
            self._mark = time.perf_counter()

    def step(self, samples: int, loss: Optional[Callable[[], float]] = None,
             accuracy: Optional[Callable[[], float]] = None) -> None:
        """One training step done on `samples` samples. `loss` and `accuracy` are called (and the
        throughput updated) at most once every GAUGE_EVERY_S seconds."""
        if not self.enabled:
            return
        now = time.perf_counter()
        m = self._m
        m["hvdk8s_step_seconds"].observe(now - self._mark)
        m["hvdk8s_steps_total"].inc()
        m["hvdk8s_samples_total"].inc(samples)
        self._samples += samples
        self._mark = now
        self._loss, self._accuracy = loss, accuracy
        if now - self._last_gauges >= GAUGE_EVERY_S:
            self._gauges(now, loss, accuracy)

    def end_epoch(self) -> None:
        """Call after an epoch's last step, before the collective that ends it on every rank: the loss,
        accuracy and throughput gauges get the epoch's final values, however short it was (a job of
        a few fast epochs would otherwise never set them)."""
        if not self.enabled:
            return
        if self._samples > self._samples_at_gauges:
            self._gauges(time.perf_counter(), self._loss, self._accuracy)
        with self._served_changed:
            self._served_at_flush = self._served

    def await_first_scrape(self, timeout: float) -> bool:
        """Before training: wait until this rank's zero counts have been scraped, at most `timeout` seconds
        (`observability.metrics.first_scrape_timeout_seconds`); True if they were. A rate needs a sample
        before the steps it counts, which a job shorter than a scrape interval would otherwise never
        give. The node's first rank counts Prometheus's scrapes, the others its reads of them."""
        if not self.enabled or self.server is None or timeout <= 0:
            return False
        with self._served_changed:
            return self._served_changed.wait_for(lambda: self._served >= 1, timeout)

    def linger(self, timeout: float) -> bool:
        """After training: keep serving until this rank's final values have been scraped, at most
        `timeout` seconds (`observability.metrics.final_scrape_timeout_seconds`); True if they were.

        Call on every rank after the collective that follows the last `end_epoch`. The node's first
        rank waits for two scrapes begun from now: Prometheus scrapes a target one after another, so the
        second begins once the first (which found every rank's final values: they were set before the
        collective) is stored. The node's other ranks wait for two reads by the first rank since their
        last `end_epoch`, which those same two scrapes make, so they are still there to be read."""
        if not self.enabled or self.server is None or timeout <= 0:
            return False
        with self._served_changed:
            since = self._served if self._first_on_node else self._served_at_flush
            return self._served_changed.wait_for(lambda: self._served >= since + 2, timeout)

    def _answered(self) -> None:
        with self._served_changed:
            self._served += 1
            self._served_changed.notify_all()

    def _gauges(self, now: float, loss, accuracy) -> None:
        m = self._m
        m["hvdk8s_samples_per_second"].set((self._samples - self._samples_at_gauges) / (now - self._last_gauges))
        self._samples_at_gauges, self._last_gauges = self._samples, now
        if loss is not None:
            m["hvdk8s_loss"].set(float(loss()))
        if accuracy is not None:
            m["hvdk8s_accuracy"].set(float(accuracy()))

    def observe(self, loss: Optional[float] = None, accuracy: Optional[float] = None) -> None:
        """Set the loss and accuracy gauges now (for example at an epoch's end)."""
        if self.enabled:
            if loss is not None:
                self._m["hvdk8s_loss"].set(float(loss))
            if accuracy is not None:
                self._m["hvdk8s_accuracy"].set(float(accuracy))

    def data_wait(self, seconds: float) -> None:
        if self.enabled:
            self._m["hvdk8s_data_wait_seconds_total"].inc(seconds)

    def allreduce_wait(self, seconds: float) -> None:
        if self.enabled:
            self._m["hvdk8s_allreduce_wait_seconds_total"].inc(seconds)

    def checkpointed(self) -> None:
        self._since_checkpoint = time.time()

    def cache(self, files_hit: int, files_missed: int, bytes_copied: int) -> None:
        if self.enabled:
            self._m["hvdk8s_cache_files_hit"].set(files_hit)
            self._m["hvdk8s_cache_files_missed"].set(files_missed)
            self._m["hvdk8s_cache_bytes_copied"].set(bytes_copied)

    def timed(self, batches: Iterable) -> Iterator:
        """`batches`, with the time spent waiting for each counted as data wait."""
        if not self.enabled:
            yield from batches
            return
        it = iter(batches)
        while True:
            began = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                return
            self.data_wait(time.perf_counter() - began)
            yield batch

    # --- serving ---------------------------------------------------------------------------------
    def serve(self, port: int, local_rank: int, local_size: int, address: Optional[str] = None) -> None:
        """Listen: the node's first rank on `port` (all interfaces unless `address`), answering for all
        `local_size` ranks of the node; the others on loopback, port + local rank."""
        if not self.enabled or self.server is not None:
            return
        from prometheus_client import CollectorRegistry, start_http_server

        registry = CollectorRegistry(auto_describe=False)
        self._first_on_node = local_rank == 0
        if local_rank == 0:
            registry.register(_Node(self.registry, [port + i for i in range(1, local_size)], self._answered))
            host = address or os.environ.get(ADDRESS_ENV, "0.0.0.0")
            where = port
        else:
            registry.register(_Counted(self.registry, self._answered))
            host, where = "127.0.0.1", port + local_rank
        if where > 65535:
            raise UserError(f"observability.metrics.port: {port} + {local_rank} (this rank's place on its node) "
                            "is past 65535; choose a lower port")
        try:
            self.server, self._thread = start_http_server(where, addr=host, registry=registry)
        except OSError as e:
            raise UserError(f"observability.metrics.port: cannot serve metrics on {host}:{where} ({e.strerror or e}); "
                            "another job or program holds it: choose another port") from None

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None


class _Counted:
    """A rank's own families, as served, counting each answer (see `Metrics.linger`)."""

    def __init__(self, own, answered: Callable[[], None]):
        self.own, self.answered = own, answered

    def collect(self):
        self.answered()
        return self.own.collect()


class _Node:
    """The first rank's answer: its own families merged with the other local ranks' (read over
    loopback at scrape time; a rank that does not answer is left out of that scrape)."""

    def __init__(self, own, peer_ports: list[int], answered: Callable[[], None]):
        self.own, self.peer_ports, self.answered = own, peer_ports, answered

    def collect(self):
        from prometheus_client.parser import text_string_to_metric_families

        self.answered()
        families: dict[str, Any] = {}
        for family in self.own.collect():
            family.samples = [s for s in family.samples if not s.name.endswith("_created")]
            families[family.name] = family
        for port in self.peer_ports:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=PEER_TIMEOUT_S) as r:
                    text = r.read().decode("utf-8")
            except OSError:
                continue
            for family in text_string_to_metric_families(text):
                if family.name.endswith("_created"):  # when a series began: noise here, and 2 per family
                    continue
                mine = families.get(family.name)
                if mine is None:
                    families[family.name] = family
                else:
                    mine.samples.extend(family.samples)
        return list(families.values())


def unusable_port(port: int, local_ranks: int, host: str = "127.0.0.1") -> Optional[str]:
    """Why the ports a node's `local_ranks` ranks serve on (port + local rank) cannot all be bound on
    `host` now, or None."""
    import socket

    if port + local_ranks - 1 > 65535:
        return f"{port} + {local_ranks - 1} (the last rank's place on its node) is past 65535; choose a lower port"
    for p in range(port, port + local_ranks):
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the metrics server binds: a closed
            try:                                                     # scrape's TIME_WAIT is no conflict
                s.bind((host, p))
            except OSError as e:
                return (f"port {p} on {host} is in use ({e.strerror or e}); rank i of a node serves on port + i: "
                        "choose another port")
    return None


_current = Metrics(enabled=False)
_lock = threading.Lock()
_job: Optional[Callable[[], Any]] = None  # see rank_of


def rank_of(job: Callable[[], Any]) -> None:
    """Name the job this process runs as a rank of: `job()` returns it (a `hvdk8s.spec.JobSpec`), called
    the first time metrics are asked for without a port or a job. Whoever starts a rank with its job
    (`hvdk8s.rankmain`, for a job's own script) calls this, so that the adapters' `metrics()` follow the
    job's `observability.metrics` without reading the job file themselves."""
    global _job
    _job = job


def job_of_process() -> Any:
    """The job `rank_of` named (read now), or None if none was."""
    return _job() if _job is not None else None


def current() -> Metrics:
    """This process's metrics (off until `start`)."""
    return _current


def start(job: str, rank: int, local_rank: int, local_size: int, port: int,
          address: Optional[str] = None) -> Metrics:
    """Turn this process's metrics on and serve them (once; later calls return the same)."""
    global _current
    with _lock:
        if not _current.enabled:
            metrics = Metrics(job, rank)
            metrics.serve(port, local_rank, local_size, address)
            _current = metrics
    return _current
