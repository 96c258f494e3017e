"""hvdk8s: Horovod data-parallel training from one machine to a Kubernetes GPU cluster.

One job file (`hvdk8s.spec`) drives local runs (`hvdk8s launch --local`) and, per rank, the trainer
(`hvdk8s train`). Users' own scripts import the framework adapter `hvdk8s.torch`, the models
(`hvdk8s.models`) and the rank-sharded loaders (`hvdk8s.data`).
"""
__version__ = "0.1.0"
