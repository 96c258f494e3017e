"""The ground floor: the small modules everything else uses, one of each: `errors` (the user-error base
the CLI reports, exit 2), `strict` (the strict pydantic base), `atomic` (whole-file writes), `quantity`
(Kubernetes quantities), `k8snames` (Kubernetes name rules), `safeyaml` (users' YAML read within bounds),
`digest` (file hashes), `suggest` ("did you mean"), `layout` (the pods' names and paths), `exiting`
(hvdk8s's own processes end without the interpreter's teardown).

Its rule: a module here imports nothing of the project outside `hvdk8s.core` (tests/test_imports.py
checks it), so it can be read, tested and reused without anything above it.
"""
