"""An entrypoint that prints the job each rank received (tests/test_user_code.py)."""
import json
import os
import sys

import hvdk8s
from hvdk8s.spec import JOB_ENV

job = hvdk8s.job()
print("JOB " + json.dumps({"epochs": job.training.epochs, "precision": job.training.precision,
                           "momentum": job.training.momentum, "file": os.environ[JOB_ENV],
                           "argv": sys.argv[1:], "rank": os.environ.get("OMPI_COMM_WORLD_RANK")}), flush=True)
