"""Kubeflow MPIJob (kubeflow.org/v2beta1) rendering from a job file. Not in this release yet: the job
file already carries `resources` and `image`, which the renderer will read."""
