"""MPIJob validation: real MPIJobs pass, broken ones are reported at the exact field, against both the
upstream CRD schema (read from ../shared/k8s, never copied into the repo) and hvdk8s's built-in rules.

What is accepted or rejected follows mpi-operator v0.8.2 (pkg/apis/kubeflow/validation after
SetDefaults_MPIJob, pkg/controller) and the API server (CRD pruning and list types, ObjectMeta, Pod
validation); hvdk8s's own policies are marked as such."""
import copy
import json
import re
from pathlib import Path

import pytest
import yaml

from conftest import OPERATOR_CRD
from hvdk8s.mpijob.validate import (BUILTIN_SCHEMA, Problem, load_crd_schema, served_crd_schema,
                                    validate_documents, validate_mpijob, validate_pod_template, validate_schema)



@pytest.fixture(params=["crd", "builtin"])
def schema(request):
    """Each test that takes `schema` runs against the CRD schema and against the built-in rules (None)."""
    return request.getfixturevalue("crd_schema") if request.param == "crd" else None


PI = """
apiVersion: kubeflow.org/v2beta1
kind: MPIJob
metadata:
  name: pi
spec:
  slotsPerWorker: 1
  runPolicy:
    cleanPodPolicy: Running
  sshAuthMountPath: /home/mpiuser/.ssh
  mpiReplicaSpecs:
    Launcher:
      replicas: 1
      template:
        spec:
          containers:
          - image: mpioperator/mpi-pi:openmpi
            name: mpi-launcher
            securityContext:
              runAsUser: 1000
            command: [mpirun]
            args: [-n, "2", /home/mpiuser/pi]
            resources:
              limits:
                cpu: 1
                memory: 1Gi
    Worker:
      replicas: 2
      template:
        spec:
          containers:
          - image: mpioperator/mpi-pi:openmpi
            name: mpi-worker
            securityContext:
              runAsUser: 1000
            command: [/usr/sbin/sshd]
            args: [-De, -f, /home/mpiuser/.sshd_config]
            resources:
              limits:
                cpu: 1
                memory: 1Gi
"""

HOROVOD_GPU = """
apiVersion: kubeflow.org/v2beta1
kind: MPIJob
metadata:
  name: horovod-resnet50
  namespace: training
  labels:
    app: horovod
spec:
  slotsPerWorker: 8
  runPolicy:
    cleanPodPolicy: Running
  mpiReplicaSpecs:
    Launcher:
      replicas: 1
      template:
        spec:
          containers:
          - name: launcher
            image: horovod/horovod:0.28.1
            imagePullPolicy: IfNotPresent
            command:
            - mpirun
            - --allow-run-as-root
            - -np
            - "16"
            - -bind-to
            - none
            - -map-by
            - slot
            - -x
            - NCCL_DEBUG=INFO
            - -x
            - LD_LIBRARY_PATH
            - -mca
            - pml
            - ob1
            - python
            - /examples/pytorch/pytorch_synthetic_benchmark.py
            - --model=resnet50
            resources:
              requests:
                cpu: 500m
                memory: 512Mi
    Worker:
      replicas: 2
      restartPolicy: Never
      template:
        metadata:
          annotations:
            sidecar.istio.io/inject: "false"
        spec:
          nodeSelector:
            nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3
          tolerations:
          - key: nvidia.com/gpu
            operator: Exists
            effect: NoSchedule
          containers:
          - name: worker
            image: horovod/horovod:0.28.1
            env:
            - name: NCCL_SOCKET_IFNAME
              value: eth0
            resources:
              limits:
                nvidia.com/gpu: 8
                memory: 400Gi
            volumeMounts:
            - name: dshm
              mountPath: /dev/shm
          volumes:
          - name: dshm
            emptyDir:
              medium: Memory
              sizeLimit: 64Gi
"""

POLICIES = """
apiVersion: kubeflow.org/v2beta1
kind: MPIJob
metadata:
  name: digits-intel
spec:
  slotsPerWorker: 2
  mpiImplementation: Intel
  launcherCreationPolicy: WaitForWorkersReady
  runLauncherAsWorker: false
  runPolicy:
    cleanPodPolicy: Running
    ttlSecondsAfterFinished: 600
    backoffLimit: 3
    activeDeadlineSeconds: 3600
    schedulingPolicy:
      minAvailable: 4
      queue: research
      priorityClass: high
      scheduleTimeoutSeconds: 120
      minResources:
        cpu: "8"
        memory: 16Gi
  mpiReplicaSpecs:
    Launcher:
      replicas: 1
      restartPolicy: OnFailure
      template:
        spec:
          containers:
          - name: launcher
            image: registry.example.com/digits:1.0
            command: [mpirun, -n, "6", python, -m, hvdk8s, train, /etc/job/job.yaml]
    Worker:
      replicas: 3
      restartPolicy: OnFailure
      template:
        spec:
          containers:
          - name: worker
            image: registry.example.com/digits:1.0
            ports:
            - containerPort: 2222
              name: ssh
            readinessProbe:
              tcpSocket:
                port: 2222
              initialDelaySeconds: 2
"""

KUEUE = """
apiVersion: kubeflow.org/v2beta1
kind: MPIJob
metadata:
  name: mpich-suspended
  labels:
    kueue.x-k8s.io/queue-name: user-queue
spec:
  slotsPerWorker: 4
  mpiImplementation: MPICH
  runLauncherAsWorker: true
  runPolicy:
    cleanPodPolicy: All
    suspend: true
    managedBy: kueue.x-k8s.io/multikueue
  mpiReplicaSpecs:
    Launcher:
      replicas: 1
      template:
        spec:
          containers:
          - name: launcher
            image: mpioperator/mpi-pi:mpich
            command: [mpirun, -n, "8", /home/mpiuser/pi]
            resources:
              limits:
                cpu: "4"
    Worker:
      replicas: 1
      template:
        spec:
          containers:
          - name: worker
            image: mpioperator/mpi-pi:mpich
            resources:
              limits:
                cpu: "4"
"""

VALID = {"pi": PI, "horovod-gpu": HOROVOD_GPU, "policies": POLICIES, "kueue-suspend": KUEUE}


@pytest.mark.parametrize("name", VALID)
def test_valid_mpijobs_have_no_problems(name, schema):
    assert validate_mpijob(yaml.safe_load(VALID[name]), schema=schema) == []


DELETE = object()
LAUNCHER = "spec.mpiReplicaSpecs.Launcher"
WORKER = "spec.mpiReplicaSpecs.Worker"
W_C0 = f"{WORKER}.template.spec.containers[0]"


def edit(job: dict, dotted: str, value) -> None:
    """Set (or, with DELETE, remove) the field at a dotted path such as `a.b[0].c`."""
    keys = [int(k[1:-1]) if k.startswith("[") else k for k in re.findall(r"\[\d+\]|[^.\[\]]+", dotted)]
    for key in keys[:-1]:
        job = job[key]
    if value is DELETE:
        del job[keys[-1]]
    elif value == "COPY-0":  # a second item equal to the first
        job.insert(keys[-1], copy.deepcopy(job[0]))
    else:
        job[keys[-1]] = value


# (id, edits on the pi job, the one path that must be reported, a word of its message)
BROKEN = [
    ("unknown-spec-field", {"spec.slotPerWorker": 1}, "spec.slotPerWorker", "unknown field"),
    ("unknown-runpolicy-field", {"spec.runPolicy.ttlSecondsAfterFinish": 5},
     "spec.runPolicy.ttlSecondsAfterFinish", "unknown field"),
    ("unknown-container-field", {f"{W_C0}.imagePullPolicyy": "Always"}, f"{W_C0}.imagePullPolicyy", "unknown field"),
    ("replicas-wrong-type", {f"{WORKER}.replicas": "two"}, f"{WORKER}.replicas", "expected integer"),
    ("replicas-over-int32", {f"{WORKER}.replicas": 2**31}, f"{WORKER}.replicas", "int32"),
    ("suspend-wrong-type", {"spec.runPolicy.suspend": "yes"}, "spec.runPolicy.suspend", "expected boolean"),
    ("slots-negative", {"spec.slotsPerWorker": -1}, "spec.slotsPerWorker", ">= 0"),
    ("backoff-negative", {"spec.runPolicy.backoffLimit": -2}, "spec.runPolicy.backoffLimit", ">= 0"),
    ("no-replica-specs", {"spec.mpiReplicaSpecs": DELETE}, "spec.mpiReplicaSpecs", "required"),
    ("no-launcher", {LAUNCHER: DELETE}, LAUNCHER, "launcher"),
    ("launcher-replicas-2", {f"{LAUNCHER}.replicas": 2}, f"{LAUNCHER}.replicas", "must be 1"),
    ("worker-replicas-0", {f"{WORKER}.replicas": 0}, f"{WORKER}.replicas", ">= 1"),
    ("replicas-missing", {f"{WORKER}.replicas": DELETE}, f"{WORKER}.replicas", "required"),
    ("unknown-replica-type", {"spec.mpiReplicaSpecs.Server": {"replicas": 1}}, "spec.mpiReplicaSpecs.Server",
     "Launcher, Worker"),
    ("no-containers", {f"{WORKER}.template.spec.containers": []}, f"{WORKER}.template.spec.containers",
     "at least one container"),
    ("restart-always", {f"{WORKER}.restartPolicy": "Always"}, f"{WORKER}.restartPolicy", "Never, OnFailure"),
    ("clean-sometimes", {"spec.runPolicy.cleanPodPolicy": "Sometimes"}, "spec.runPolicy.cleanPodPolicy", "Sometimes"),
    ("launcher-creation-bogus", {"spec.launcherCreationPolicy": "Eventually"}, "spec.launcherCreationPolicy",
     "WaitForWorkersReady"),
    ("mpi-implementation-bogus", {"spec.mpiImplementation": "MVAPICH"}, "spec.mpiImplementation", "OpenMPI"),
    ("managed-by-bogus", {"spec.runPolicy.managedBy": "example.com/operator"}, "spec.runPolicy.managedBy",
     "kueue.x-k8s.io/multikueue"),
    # 55 + len("-worker-1") = 64 > 63
    ("name-too-long", {"metadata.name": "a" * 55}, "metadata.name", "DNS-1035"),
    ("name-not-dns", {"metadata.name": "My_Job"}, "metadata.name", "DNS-1123"),
    ("name-missing", {"metadata.name": DELETE}, "metadata.name", "required"),
    ("privileged", {f"{W_C0}.securityContext.privileged": True}, f"{W_C0}.securityContext.privileged",
     "hvdk8s policy: privileged"),
    ("api-version", {"apiVersion": "kubeflow.org/v1"}, "apiVersion", "kubeflow.org/v2beta1"),
    ("kind", {"kind": "TFJob"}, "kind", "MPIJob"),
    ("container-no-name", {f"{W_C0}.name": DELETE}, f"{W_C0}.name", "required"),
    ("container-no-image", {f"{W_C0}.image": DELETE}, f"{W_C0}.image", "required"),
    ("bad-quantity", {f"{W_C0}.resources.limits.memory": "4GB"}, f"{W_C0}.resources.limits.memory", "quantity"),
    ("bad-min-resources", {"spec.runPolicy.schedulingPolicy": {"minResources": {"cpu": "lots"}}},
     "spec.runPolicy.schedulingPolicy.minResources.cpu", "pattern"),
    ("container-port-type", {f"{W_C0}.ports": [{"containerPort": "ssh"}]}, f"{W_C0}.ports[0].containerPort",
     "expected integer"),
    # what the API server or the operator rejects, found by the issue's review
    ("no-spec", {"spec": DELETE}, "spec.mpiReplicaSpecs", "required"),
    ("mount-without-volume", {f"{W_C0}.volumeMounts": [{"name": "data", "mountPath": "/data"}]},
     f"{W_C0}.volumeMounts[0].name", "no volume named 'data'"),
    ("gpu-request-below-limit", {f"{W_C0}.resources": {"requests": {"nvidia.com/gpu": 1},
                                                      "limits": {"nvidia.com/gpu": 2}}},
     f"{W_C0}.resources.requests.nvidia.com/gpu", "must equal"),
    ("gpu-request-without-limit", {f"{W_C0}.resources": {"requests": {"nvidia.com/gpu": 1}}},
     f"{W_C0}.resources.limits.nvidia.com/gpu", "required"),
    ("gpu-fraction", {f"{W_C0}.resources.limits": {"nvidia.com/gpu": "500m"}},
     f"{W_C0}.resources.limits.nvidia.com/gpu", "whole number"),
    ("request-above-limit", {f"{W_C0}.resources": {"requests": {"cpu": "2"}, "limits": {"cpu": "1"}}},
     f"{W_C0}.resources.requests.cpu", "at most the cpu limit"),
    ("negative-request", {f"{W_C0}.resources": {"requests": {"memory": "-1Gi"}}},
     f"{W_C0}.resources.requests.memory", "greater than or equal to 0"),
    ("bad-resource-name", {f"{W_C0}.resources.limits": {"gpu": 1}}, f"{W_C0}.resources.limits.gpu",
     "not a container resource"),
    ("port-over-65535", {f"{W_C0}.ports": [{"containerPort": 70000}]}, f"{W_C0}.ports[0].containerPort",
     "1-65535"),
    ("host-port-over-65535", {f"{W_C0}.ports": [{"containerPort": 22, "hostPort": 65536}]},
     f"{W_C0}.ports[0].hostPort", "1-65535"),
    ("probe-port-zero", {f"{W_C0}.readinessProbe": {"tcpSocket": {"port": 0}}},
     f"{W_C0}.readinessProbe.tcpSocket.port", "1-65535"),
    ("port-name-too-long", {f"{W_C0}.ports": [{"containerPort": 22, "name": "a-very-long-port-name"}]},
     f"{W_C0}.ports[0].name", "1-15"),
    ("duplicate-ports", {f"{W_C0}.ports": [{"containerPort": 22}, {"containerPort": 22, "protocol": "TCP"}]},
     f"{W_C0}.ports[1]", "duplicate entry"),
    ("label-value", {"metadata.labels": {"app": "a b"}}, "metadata.labels.app", "letters"),
    ("label-key", {"metadata.labels": {"bad/key/x": "v"}}, "metadata.labels.bad/key/x", "prefix"),
    ("template-label-value", {f"{WORKER}.template.metadata": {"labels": {"x": "-bad"}}},
     f"{WORKER}.template.metadata.labels.x", "letters"),
    ("annotation-key", {"metadata.annotations": {"a b": "c"}}, "metadata.annotations.a b", "name part"),
    ("namespace-not-dns", {"metadata.namespace": "Team_A"}, "metadata.namespace", "DNS-1123 label"),
    ("node-selector-value", {f"{WORKER}.template.spec.nodeSelector": {"pool": "a b"}},
     f"{WORKER}.template.spec.nodeSelector.pool", "letters"),
    ("duplicate-container-names", {f"{WORKER}.template.spec.containers[1]": "COPY-0"},
     f"{WORKER}.template.spec.containers[1].name", "duplicate"),
    ("init-container-same-name", {f"{WORKER}.template.spec.initContainers": [
        {"name": "mpi-worker", "image": "busybox"}]}, f"{WORKER}.template.spec.containers[0].name", "duplicate"),
    ("container-name-not-dns", {f"{W_C0}.name": "Worker_1"}, f"{W_C0}.name", "DNS-1123 label"),
    ("null-container", {f"{WORKER}.template.spec.containers": [None]}, f"{WORKER}.template.spec.containers[0]",
     "null"),
    ("null-arg", {f"{W_C0}.args": [None]}, f"{W_C0}.args[0]", "null"),
    ("duplicate-env", {f"{W_C0}.env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]},
     f"{W_C0}.env[1].name", "duplicate"),
    ("operator-volume-name", {f"{WORKER}.template.spec.volumes": [{"name": "ssh-auth", "emptyDir": {}}]},
     f"{WORKER}.template.spec.volumes[0].name", "the MPI operator adds"),
    ("mount-over-hostfile", {f"{LAUNCHER}.template.spec.volumes": [{"name": "x", "emptyDir": {}}],
                             f"{LAUNCHER}.template.spec.containers[0].volumeMounts": [
                                 {"name": "x", "mountPath": "/etc/mpi"}]},
     f"{LAUNCHER}.template.spec.containers[0].volumeMounts[0].mountPath", "mpi-job-config"),
    ("toleration-value-with-exists", {f"{WORKER}.template.spec.tolerations": [
        {"key": "a", "operator": "Exists", "value": "b"}]}, f"{WORKER}.template.spec.tolerations[0].value", "empty"),
    ("generate-name-too-long", {"metadata.name": DELETE, "metadata.generateName": "a" * 50 + "-"},
     "metadata.generateName", "DNS-1035"),
    ("restart-policy-bogus", {f"{LAUNCHER}.restartPolicy": "Sometimes"}, f"{LAUNCHER}.restartPolicy", "Never"),
    ("labels-not-a-map", {"metadata.labels": "app=pi"}, "metadata.labels", "expected object"),  # was a traceback
    # The CRD types quantities as integer or string; the Pod schema kubernetes-validate bundles also takes a float.
    ("float-quantity", {f"{W_C0}.resources.limits.cpu": 0.5}, f"{W_C0}.resources.limits.cpu",
     "expected integer or string, got number"),
    ("float-size-limit", {f"{WORKER}.template.spec.volumes": [{"name": "x", "emptyDir": {"sizeLimit": 1.5}}]},
     f"{WORKER}.template.spec.volumes[0].emptyDir.sizeLimit", "expected integer or string"),
]


@pytest.mark.parametrize("edits, path, word", [case[1:] for case in BROKEN], ids=[case[0] for case in BROKEN])
def test_broken_mpijob_is_reported_at_the_field(schema, edits, path, word):
    job = yaml.safe_load(PI)
    for dotted, value in edits.items():
        edit(job, dotted, value)
    problems = validate_mpijob(job, schema=schema)
    assert {p.path for p in problems} == {path}, problems  # that field, and no collateral noise
    assert any(word in p.message for p in problems), problems


def test_slots_per_worker_zero_is_accepted_like_the_controller_does(schema):
    # Neither the CRD (no minimum) nor mpi-operator (ValidateNonnegativeField) rejects 0.
    job = yaml.safe_load(PI)
    job["spec"]["slotsPerWorker"] = 0
    assert validate_mpijob(job, schema=schema) == []


def test_every_problem_is_reported_at_once(schema):
    job = yaml.safe_load(HOROVOD_GPU)
    edit(job, "spec.slotPerWorker", 8)
    edit(job, f"{LAUNCHER}.replicas", 2)
    edit(job, f"{WORKER}.restartPolicy", "Always")
    edit(job, f"{W_C0}.imagePullPolicyy", "Always")
    edit(job, f"{W_C0}.securityContext", {"privileged": True})
    edit(job, "spec.runPolicy.cleanPodPolicy", "Sometimes")
    problems = validate_mpijob(job, schema=schema)
    assert [p.path for p in problems] == sorted([
        "spec.slotPerWorker", f"{LAUNCHER}.replicas", f"{WORKER}.restartPolicy", f"{W_C0}.imagePullPolicyy",
        f"{W_C0}.securityContext.privileged", "spec.runPolicy.cleanPodPolicy"])
    assert problems == sorted(set(problems))


def test_pod_schema_can_be_left_out():
    job = yaml.safe_load(PI)
    edit(job, f"{W_C0}.imagePullPolicyy", "Always")
    assert validate_mpijob(job, pod_schema=False) == []
    assert [str(p) for p in validate_mpijob(job)] == [f"{W_C0}.imagePullPolicyy: unknown field"]


def test_pod_template_paths_start_at_the_given_path():
    template = {"metadata": {"labelz": {}}, "spec": {"containers": [{"image": "x"}], "hostNetwork": "yes"}}
    assert validate_pod_template(template, "t") == [
        Problem("t.metadata.labelz", "unknown field"),
        Problem("t.spec.containers[0].name", "required field is missing"),
        Problem("t.spec.hostNetwork", "expected boolean, got string"),
    ]


@pytest.mark.parametrize("value, schema, message", [
    ("ab", {"type": "string", "maxLength": 1}, "at most 1 characters"),
    ("", {"type": "string", "minLength": 1}, "at least 1 characters"),
    ([], {"type": "array", "items": {"type": "string"}, "minItems": 1}, "at least 1 items"),
    ([1, 2], {"type": "array", "maxItems": 1}, "at most 1 items"),
    (None, {"type": "string"}, "must not be null"),
    (0, {"type": "integer", "minimum": 1}, ">= 1"),
    (11, {"type": "integer", "maximum": 10}, "<= 10"),
    (1.5, {"type": "integer"}, "expected integer, got number"),
    ("b", {"type": "string", "enum": ["a"]}, "unsupported value 'b'"),
    ("x1", {"type": "string", "pattern": "^[0-9]+$"}, "pattern"),
    (True, {"x-kubernetes-int-or-string": True}, "expected integer or string"),
    (True, {"anyOf": [{"type": "integer"}, {"type": "string"}]}, "none of the allowed forms (integer, string)"),
])
def test_schema_keywords(value, schema, message):
    problems = validate_schema(value, schema, "f")
    assert len(problems) == 1 and problems[0].path == "f" and message in problems[0].message, problems


def test_schema_objects_and_unknown_fields():
    schema = {"type": "object", "required": ["a"], "properties": {
        "a": {"type": "array", "items": {"type": "integer"}},
        "open": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "maybe": {"type": "string", "nullable": True},
    }}
    good = {"a": [1], "open": {"anything": {"x": 1}}, "labels": {"k": "v"}, "maybe": None}
    assert validate_schema(good, schema) == []
    bad = {"a": [1, "2", 3.0], "labels": {"k": 1}, "b": 1, "open": []}
    assert sorted(validate_schema(bad, schema)) == [
        Problem("a[1]", "expected integer, got string"),
        Problem("a[2]", "expected integer, got number"),
        Problem("b", "unknown field"),
        Problem("labels.k", "expected string, got integer"),
        Problem("open", "expected object, got array"),
    ]
    assert validate_schema({}, schema) == [Problem("a", "required field is missing")]


def test_problem_str():
    assert str(Problem("spec.slotsPerWorker", "must be >= 0")) == "spec.slotsPerWorker: must be >= 0"
    assert str(Problem("", "not an MPIJob")) == "(top level): not an MPIJob"
    assert validate_mpijob([]) == [Problem("", "expected an MPIJob object, got array")]


def test_builtin_rules_know_every_crd_spec_field(crd_schema):
    # The built-in description must not reject a field the CRD has (nor accept one it lacks).
    def fields(schema: dict, *keys: str) -> set:
        for key in keys:
            schema = schema["additionalProperties"] if key == "*" else schema["properties"][key]
        return set(schema["properties"])

    for keys in [(), ("spec",), ("spec", "runPolicy"), ("spec", "runPolicy", "schedulingPolicy"),
                 ("spec", "mpiReplicaSpecs", "*"), ("spec", "mpiReplicaSpecs", "*", "template")]:
        assert fields(BUILTIN_SCHEMA, *keys) == fields(crd_schema, *keys), keys


def quantity_paths(schema: dict, path: str = "") -> set:
    """Where SCHEMA types a resource.Quantity (integer or string, with the quantity pattern)."""
    found = {path} if schema.get("x-kubernetes-int-or-string") and "pattern" in schema else set()
    for key, sub in schema.get("properties", {}).items():
        found |= quantity_paths(sub, f"{path}.{key}")
    for key in ("additionalProperties", "items"):
        if isinstance(schema.get(key), dict):
            found |= quantity_paths(schema[key], f"{path}.{'*' if key == 'additionalProperties' else '[]'}")
    return found


def test_builtin_rules_type_every_quantity_the_crd_types(crd_schema):
    # Else hvdk8s's own rules would accept a float the API server refuses.
    crd = quantity_paths(crd_schema)
    assert ".spec.mpiReplicaSpecs.*.template.spec.containers.[].resources.limits.*" in crd
    assert crd <= quantity_paths(BUILTIN_SCHEMA), crd - quantity_paths(BUILTIN_SCHEMA)


def test_the_served_crd_is_read_through_the_kubernetes_client(crd_schema, monkeypatch):
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    crd = yaml.safe_load(OPERATOR_CRD.read_text())
    asked = []

    class Extensions:
        def __init__(self, api_client):
            asked.append(api_client)

        def read_custom_resource_definition(self, name, **options):
            if name != "mpijobs.kubeflow.org" or options.get("_request_timeout") != 5:
                raise ApiException(status=404)
            return type("Response", (), {"data": json.dumps(crd).encode()})()

    monkeypatch.setattr(client, "ApiextensionsV1Api", Extensions)
    assert served_crd_schema("the api client", timeout=5) == crd_schema and asked == ["the api client"]
    assert served_crd_schema("the api client") is None  # not found (or forbidden): hvdk8s's own rules stand in


def test_load_crd_schema_from_yaml_json_and_dict(crd_schema, tmp_path):
    crd = yaml.safe_load(OPERATOR_CRD.read_text())
    as_json = tmp_path / "crd.json"
    as_json.write_text(json.dumps(crd))
    assert load_crd_schema(as_json) == load_crd_schema(crd) == crd_schema
    assert crd_schema["properties"]["spec"]["required"] == ["mpiReplicaSpecs"]


def test_load_crd_schema_errors_name_the_file(crd_schema, tmp_path):
    crd = yaml.safe_load(OPERATOR_CRD.read_text())
    with pytest.raises(ValueError, match=r"no version v1 \(it has: v2beta1\)"):
        load_crd_schema(crd, version="v1")
    other = copy.deepcopy(crd)
    other["spec"]["names"]["kind"] = "TFJob"
    path = tmp_path / "tfjob-crd.yaml"
    path.write_text(yaml.safe_dump(other))
    with pytest.raises(ValueError, match=re.escape(f"{path}: not the MPIJob CustomResourceDefinition")):
        load_crd_schema(path)
    path.write_text("kind: ConfigMap\n")
    with pytest.raises(ValueError, match="not the MPIJob"):
        load_crd_schema(path)


CONFIGMAP = """
apiVersion: v1
kind: ConfigMap
metadata:
  name: pi-job
data:
  job.yaml: "framework: pytorch"
"""


def test_documents_are_validated_with_their_index(schema):
    broken = yaml.safe_load(PI)
    edit(broken, "spec.slotPerWorker", 1)
    text = "---\n" + CONFIGMAP + "---\n" + yaml.safe_dump(broken) + "---\n" + KUEUE
    assert [str(p) for p in validate_documents(text, schema=schema)] == ["[doc 2] spec.slotPerWorker: unknown field"]
    assert validate_documents(CONFIGMAP + "---\n" + PI, schema=schema) == []
    assert [str(p) for p in validate_documents(yaml.safe_dump(broken), schema=schema)] == [
        "spec.slotPerWorker: unknown field"]
    assert validate_documents([yaml.safe_load(CONFIGMAP), {"kind": "MPIJob"}], schema=schema)[0].path.startswith(
        "[doc 2] ")


def test_documents_without_mpijob_or_yaml():
    assert [str(p) for p in validate_documents(CONFIGMAP)] == ["(top level): no MPIJob document found"]
    assert validate_documents("a: [b")[0].message.startswith("not valid YAML")


# --- accepted as the operator accepts them ------------------------------------------------------------

ACCEPTED = [
    ("launcher-without-replicas", {f"{LAUNCHER}.replicas": DELETE}),  # SetDefaults_MPIJob: 1
    ("generate-name", {"metadata.name": DELETE, "metadata.generateName": "pi-"}),
    ("null-slots", {"spec.slotsPerWorker": None}),  # pruned, then defaulted to 1
    ("null-command", {f"{W_C0}.command": None}),    # pruned: the CRD has no nullable field
    ("null-clean-pod-policy", {"spec.runPolicy.cleanPodPolicy": None}),
    ("empty-ssh-mount-path", {"spec.sshAuthMountPath": ""}),  # the operator defaults "" to /root/.ssh
    ("empty-restart-policy", {f"{WORKER}.restartPolicy": ""}),
    ("no-worker", {WORKER: DELETE}),  # a launcher alone (e.g. runLauncherAsWorker): the operator allows it
    ("null-worker", {WORKER: None}),
    ("slots-zero", {"spec.slotsPerWorker": 0}),
    ("mount-of-operator-volume", {f"{W_C0}.volumeMounts": [{"name": "ssh-auth", "mountPath": "/keys"}]}),
    ("gpu-limit-only", {f"{W_C0}.resources": {"limits": {"nvidia.com/gpu": 8}}}),
    ("named-probe-port", {f"{W_C0}.ports": [{"containerPort": 2222, "name": "ssh"}],
                          f"{W_C0}.readinessProbe": {"tcpSocket": {"port": "ssh"}}}),
    ("same-port-two-protocols", {f"{W_C0}.ports": [{"containerPort": 53}, {"containerPort": 53, "protocol": "UDP"}]}),
]


@pytest.mark.parametrize("edits", [case[1] for case in ACCEPTED], ids=[case[0] for case in ACCEPTED])
def test_what_the_operator_accepts_passes(schema, edits):
    job = yaml.safe_load(PI)
    for dotted, value in edits.items():
        edit(job, dotted, value)
    assert validate_mpijob(job, schema=schema) == []


def test_no_spec_is_one_problem_in_both_modes(schema):
    job = yaml.safe_load(PI)
    del job["spec"]
    assert validate_mpijob(job, schema=schema) == [Problem("spec.mpiReplicaSpecs", "required field is missing")]


# --- hvdk8s's policies: stated, flagged, and possible to leave out ---------------------------------

POLICY_EDITS = [
    ("privileged", {f"{W_C0}.securityContext.privileged": True}),
    ("unknown-replica-type", {"spec.mpiReplicaSpecs.Server": {"replicas": 1}}),
    ("launcher-creation-typo", {"spec.launcherCreationPolicy": "WaitForWorkerReady"}),
]


@pytest.mark.parametrize("edits", [case[1] for case in POLICY_EDITS], ids=[case[0] for case in POLICY_EDITS])
def test_policies_are_marked_and_can_be_left_out(schema, edits):
    job = yaml.safe_load(PI)
    for dotted, value in edits.items():
        edit(job, dotted, value)
    problems = validate_mpijob(job, schema=schema)
    assert len(problems) == 1 and problems[0].policy and problems[0].message.startswith("hvdk8s policy: ")
    assert validate_mpijob(job, schema=schema, policies=False) == []  # the operator would run it
    assert [p.policy for p in validate_documents([job], schema=schema)] == [True]


def test_the_cli_states_its_policy_and_leaves_it_out_when_told(tmp_path):
    from conftest import invoke

    job = yaml.safe_load(PI)
    edit(job, f"{W_C0}.securityContext.privileged", True)
    path = tmp_path / "privileged.yaml"
    path.write_text(yaml.safe_dump(job))
    refused = invoke("validate", path)
    assert refused.exit_code == 2 and "hvdk8s policy: " in refused.stderr and "privileged" in refused.stderr
    judged_as_the_operator = invoke("validate", path, "--no-policy")
    assert judged_as_the_operator.exit_code == 0, judged_as_the_operator.stderr
    assert "policies left out" in judged_as_the_operator.stdout


# --- a CRD file that is not a CRD: one line naming the file, exit 2 (issue 12) --------------------------

@pytest.mark.parametrize("content,word", [
    (b"a: [b\n", "not valid YAML"),
    ("kind: caf\xe9\n".encode("latin-1"), "not UTF-8"),
    (b"# comment\n" * 900_000, "larger than"),
    (b"kind: CustomResourceDefinition\nspec: {group: kubeflow.org, names: {kind: MPIJob}, versions: abc}\n",
     "no version v2beta1"),
    (b"kind: CustomResourceDefinition\nspec: {group: kubeflow.org, names: {kind: MPIJob}, versions: [1, "
     b"{name: v2beta1, schema: []}]}\n", "no openAPIV3Schema"),
    (b"a: 1\n---\nb: 2\n", "one YAML document"),
    ("/dev/zero", "larger than"),
], ids=["not-yaml", "latin-1", "oversize", "versions-not-a-list", "schema-not-a-mapping", "two-documents",
        "dev-zero"])
def test_validate_with_a_bad_crd_file_names_it_in_one_line(tmp_path, content, word):
    from conftest import invoke

    job = tmp_path / "pi.yaml"
    job.write_text(PI)
    if isinstance(content, str):
        crd = content
    else:
        crd = str(tmp_path / "crd.yaml")
        Path(crd).write_bytes(content)
    result = invoke("validate", job, "--crd", crd)
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and crd in lines[0] and word in lines[0], result.stderr
