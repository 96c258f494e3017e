"""hvdk8s: Horovod data-parallel training from one machine to a Kubernetes GPU cluster.

One job file (`hvdk8s.spec`) drives local runs (`hvdk8s launch --local`), the rendered MPIJob and, per
rank, the trainer (`hvdk8s train`) or the user's own script. Scripts import the framework adapter
(`hvdk8s.torch` or `hvdk8s.tensorflow`), the models (`hvdk8s.models`) and the rank-sharded loaders
(`hvdk8s.data`), and read their job with `hvdk8s.job()`.
"""
from hvdk8s._version import __version__  # noqa: F401  (hvdk8s.__version__)


def job():
    """The validated job (a `hvdk8s.spec.JobSpec`, defaults filled in) this rank was started for by
    `hvdk8s launch` or a rendered MPIJob, so a script and its job file never disagree."""
    from hvdk8s.spec import current_job  # here: `import hvdk8s.torch` runs this file and needs no job schema

    return current_job()
