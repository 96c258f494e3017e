"""Kubeflow MPIJob (kubeflow.org/v2beta1) from a job file: `topology` (nodes and slots), `network` (RDMA,
NCCL and OpenMPI interfaces), `environment` (the ranks' variables), `volumes`, `cache` (node-local
dataset cache), `scheduling` (placement, priority, gang), `security` (security contexts), `checks` (what a
cluster needs of a job file), `monitoring` (Prometheus scraping of the ranks' pods), `render` (objects
and deterministic YAML), and on the other side `validate` (CRD or built-in schema, the operator's rules,
the API server's Pod rules), `podsecurity` (Pod Security Standards), `operator` (the pods mpi-operator
makes of a template), `api` (the MPIJob API's identity). The pods' names and paths are
`hvdk8s.core.layout` (the job file's models read them too)."""
