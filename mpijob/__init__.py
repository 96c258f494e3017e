"""Kubeflow MPIJob (kubeflow.org/v2beta1) from a job file: `topology` (nodes and slots), `network`
(RDMA and NCCL), `render` (objects and deterministic YAML), `validate` (CRD schema and the operator's
rules)."""
