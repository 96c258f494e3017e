"""`observability`: the ranks' Prometheus metrics, Horovod's timeline and autotuning, TensorBoard scalars,
and the names of the files they write in the job's run directory."""
from __future__ import annotations

from typing import Optional

from pydantic import Field, field_validator

from hvdk8s.core.strict import StrictModel


class MetricsSpec(StrictModel):
    """Prometheus metrics from every rank (see hvdk8s/metrics.py for what is exported)."""

    enabled: Optional[bool] = Field(default=None, description="serve them (default: on in cluster runs, off in "
                                                               "local ones)")
    port: int = Field(default=9400, ge=1024, le=65535, description="each node's first rank serves every rank of "
                                                                   "the node here; rank i of a node also uses "
                                                                   "port+i on loopback")
    pod_monitor: bool = Field(default=False, description="`hvdk8s render` also writes a PodMonitor for the "
                                                         "Prometheus Operator")
    scrape_interval_seconds: int = Field(default=15, ge=1, le=3600, description="the PodMonitor's interval")
    first_scrape_timeout_seconds: int = Field(
        default=0, ge=0, le=3600, description="before training, each rank waits until Prometheus has scraped "
                                              "its zero counts, at most this long (a job shorter than two "
                                              "scrape intervals otherwise leaves its rates without a "
                                              "baseline); 0: the ranks start at once")
    final_scrape_timeout_seconds: int = Field(
        default=0, ge=0, le=3600, description="after training, each rank keeps serving until Prometheus has "
                                              "scraped its final values, waiting at most this long (a job "
                                              "shorter than a scrape interval otherwise leaves no series); 0: "
                                              "the ranks end at once")


TIMELINE_FILE = "horovod-timeline.json"
AUTOTUNE_FILE = "horovod-autotune.csv"
TENSORBOARD_DIR = "tensorboard"


class ObservabilitySpec(StrictModel):
    """Metrics, Horovod's timeline and autotuning, TensorBoard scalars."""

    metrics: MetricsSpec = Field(default_factory=MetricsSpec)
    dir: Optional[str] = Field(default=None, description="the run directory: timeline, autotune log and "
                                                         "TensorBoard events (default: training.checkpoint.dir)")
    timeline: bool = Field(default=False, description=f"Horovod's timeline (Chrome trace) as DIR/{TIMELINE_FILE}")
    autotune: bool = Field(default=False, description=f"Horovod's autotuning, its log as DIR/{AUTOTUNE_FILE}")
    tensorboard: bool = Field(default=False, description=f"rank 0's scalars under DIR/{TENSORBOARD_DIR}")

    @field_validator("dir")
    @classmethod
    def _a_path(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and ("\0" in v or not v.strip()):
            raise ValueError("must be a directory path")
        return v

    @property
    def wanted(self) -> list[str]:
        """The switches that write into the run directory."""
        return [f for f in ("timeline", "autotune", "tensorboard") if getattr(self, f)]
