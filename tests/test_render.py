"""MPIJob rendering: golden files, determinism, topology, networking, and validity of what is rendered
(the MPIJob CRD's schema, the operator's rules, Pod specs, kustomize)."""
import os
import shutil
import subprocess

import pytest
import yaml

from conftest import ROOT, cli
from hvdk8s.mpijob import render as renderer
from hvdk8s.mpijob import validate as mv
from hvdk8s.spec import load_job

GOLDEN = ROOT / "tests" / "golden"
CASES = sorted(p.name for p in GOLDEN.iterdir() if (p / "job.yaml").is_file())
UPDATE = os.environ.get("HVDK8S_UPDATE_GOLDEN") == "1"  # regenerate after an intended change


def rendered(case: str) -> dict:
    configmap, job = renderer.render(load_job(GOLDEN / case / "job.yaml"))
    return {"configmap": configmap, "mpijob": job}


def containers(job, role):
    return job["spec"]["mpiReplicaSpecs"][role]["template"]["spec"]["containers"]


def env_of(container):
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_golden_cases_cover_the_required_shapes():
    assert CASES == ["cpu", "gpu-1x8", "gpu-4x8-rdma", "gpu-4x8-tcp", "s3-cached"]


@pytest.mark.parametrize("case", CASES)
def test_render_matches_golden_files_and_is_byte_identical_twice(case, tmp_path):
    if UPDATE:
        renderer.write_directory(load_job(GOLDEN / case / "job.yaml"), GOLDEN / case)
    proc = cli("render", GOLDEN / case / "job.yaml", "-o", tmp_path)
    assert proc.returncode == 0, proc.stderr
    for name in ("configmap.yaml", "mpijob.yaml", "kustomization.yaml"):
        assert (tmp_path / name).read_text() == (GOLDEN / case / name).read_text(), f"{case}/{name} changed"
    first, second = cli("render", GOLDEN / case / "job.yaml"), cli("render", GOLDEN / case / "job.yaml")
    assert first.returncode == 0 and first.stdout == second.stdout
    docs = list(yaml.safe_load_all(first.stdout))
    assert [d["kind"] for d in docs] == ["ConfigMap", "MPIJob"]


@pytest.mark.parametrize("case", CASES)
def test_kubectl_kustomize_builds_the_rendered_directory(case, tmp_path):
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl is missing: scripts/setup.sh installs it (Debian kubernetes-client)"
    shutil.copytree(GOLDEN / case, tmp_path / case)
    proc = subprocess.run([kubectl, "kustomize", str(tmp_path / case)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    built = {d["kind"]: d for d in yaml.safe_load_all(proc.stdout)}
    assert set(built) == {"ConfigMap", "MPIJob"}
    assert built["MPIJob"]["metadata"]["namespace"] == load_job(GOLDEN / case / "job.yaml").kubernetes.namespace


def test_four_nodes_of_eight_gpus():
    job = rendered("gpu-4x8-rdma")["mpijob"]
    spec = job["spec"]
    assert spec["slotsPerWorker"] == 8 and spec["mpiReplicaSpecs"]["Worker"]["replicas"] == 4
    worker = containers(job, "Worker")[0]
    assert worker["resources"]["limits"]["nvidia.com/gpu"] == "8"
    pod = spec["mpiReplicaSpecs"]["Worker"]["template"]["spec"]
    term = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"] == {"hvdk8s.io/job": "lm-4x8-rdma", "hvdk8s.io/role": "worker"}
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    launcher = containers(job, "Launcher")[0]
    cmd = launcher["command"]
    assert cmd[:8] == ["mpirun", "-np", "32", "-bind-to", "none", "-map-by", "slot", "-mca"]
    assert cmd[-3:] == ["hvdk8s", "train", "/etc/hvdk8s/job.yaml"]
    assert "nvidia.com/gpu" not in launcher["resources"]["limits"]
    assert env_of(launcher)["HOROVOD_HIERARCHICAL_ALLREDUCE"] == "1"
    # every variable the ranks get is forwarded to them by mpirun
    forwarded = {cmd[i + 1] for i, a in enumerate(cmd) if a == "-x"}
    assert set(env_of(launcher)) <= forwarded and {"PATH", "LD_LIBRARY_PATH"} <= forwarded


def test_one_node_of_eight_gpus_has_no_hierarchical_allreduce():
    job = rendered("gpu-1x8")["mpijob"]
    assert job["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] == 1 and job["spec"]["slotsPerWorker"] == 8
    assert "HOROVOD_HIERARCHICAL_ALLREDUCE" not in env_of(containers(job, "Launcher")[0])


def test_cpu_job_uses_ranks_per_worker_and_no_gpu_or_nccl():
    job = rendered("cpu")["mpijob"]
    assert job["spec"]["slotsPerWorker"] == 4 and job["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] == 2
    worker = containers(job, "Worker")[0]
    assert "nvidia.com/gpu" not in worker["resources"]["limits"]
    env = env_of(containers(job, "Launcher")[0])
    assert env["OMP_NUM_THREADS"] == "2" and not any(k.startswith("NCCL_") for k in env)
    assert containers(job, "Launcher")[0]["command"][2] == "8"
    affinity = job["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    assert "preferredDuringSchedulingIgnoredDuringExecution" in affinity


def test_rdma_on():
    job = rendered("gpu-4x8-rdma")["mpijob"]
    template = job["spec"]["mpiReplicaSpecs"]["Worker"]["template"]
    worker = template["spec"]["containers"][0]
    assert worker["resources"]["limits"]["rdma/rdma_shared_device_a"] == "1"
    assert worker["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]
    assert worker["securityContext"]["privileged"] is False
    assert template["metadata"]["annotations"] == {"k8s.v1.cni.cncf.io/networks": "rdma-net"}
    env = env_of(containers(job, "Launcher")[0])
    assert {k: env[k] for k in env if k.startswith("NCCL_")} == {
        "NCCL_IB_DISABLE": "0", "NCCL_IB_HCA": "mlx5", "NCCL_IB_GID_INDEX": "3", "NCCL_NET_GDR_LEVEL": "PHB",
        "NCCL_SOCKET_IFNAME": "eth0"}


def test_rdma_off():
    job = rendered("gpu-4x8-tcp")["mpijob"]
    worker = containers(job, "Worker")[0]
    assert not any(k.startswith("rdma/") for k in worker["resources"]["limits"])
    assert "add" not in worker["securityContext"]["capabilities"]
    env = env_of(containers(job, "Launcher")[0])
    assert env["NCCL_IB_DISABLE"] == "1" and env["NCCL_SOCKET_IFNAME"] == "ens5"
    assert job["spec"]["runPolicy"]["cleanPodPolicy"] == "All"


def test_shm_start_policy_readiness_and_non_root_user():
    job = rendered("gpu-4x8-rdma")["mpijob"]
    spec = job["spec"]
    assert spec["launcherCreationPolicy"] == "WaitForWorkersReady"
    assert spec["sshAuthMountPath"] == "/home/mpiuser/.ssh"
    pod = spec["mpiReplicaSpecs"]["Worker"]["template"]["spec"]
    shm = next(v for v in pod["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "128Gi"}
    assert pod["containers"][0]["readinessProbe"]["tcpSocket"]["port"] == 2222
    assert pod["securityContext"]["runAsNonRoot"] is True
    cache = next(v for v in pod["volumes"] if v["name"] == "dataset-cache")
    assert cache["hostPath"]["path"] == "/var/cache/hvdk8s"
    assert "initContainers" not in pod  # a built-in dataset needs no cache sync


def test_cached_dataset_is_synced_by_init_containers_before_the_ranks():
    job = rendered("s3-cached")["mpijob"]
    pod = job["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]
    permissions, sync = pod["initContainers"]
    assert permissions["command"] == ["chown", "1000:1000", "/var/cache/hvdk8s"]
    assert permissions["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN"]}
    assert permissions["securityContext"]["privileged"] is False
    assert sync["command"] == ["hvdk8s", "cache", "sync", "s3://datasets/cifar10-shards", "/var/cache/hvdk8s",
                               "--version", "2024-06", "--quota", "500Gi"]
    assert "runAsUser" not in sync["securityContext"]  # the pod's non-root user
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in sync["env"]}
    assert env == {"AWS_ENDPOINT_URL": "https://minio.storage.svc:9000",
                   "AWS_ACCESS_KEY_ID": {"secretKeyRef": {"name": "minio-creds", "key": "AWS_ACCESS_KEY_ID"}},
                   "AWS_SECRET_ACCESS_KEY": {"secretKeyRef": {"name": "minio-creds", "key": "AWS_SECRET_ACCESS_KEY"}}}
    assert all(m["mountPath"] == "/var/cache/hvdk8s" for c in (permissions, sync) for m in c["volumeMounts"])
    launcher_env = env_of(containers(job, "Launcher")[0])
    assert launcher_env["HVDK8S_CACHE_DIR"] == "/var/cache/hvdk8s"  # forwarded to the ranks (-x)
    assert "HVDK8S_CACHE_DIR" in containers(job, "Launcher")[0]["command"]


def test_cache_warm_daemonset_fills_the_job_nodes():
    from hvdk8s.mpijob.validate import validate_pod_template

    spec = load_job(GOLDEN / "s3-cached" / "job.yaml")
    ds = renderer.warm_daemonset(spec)
    worker_pod = renderer.mpijob(spec)["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]
    pod = ds["spec"]["template"]["spec"]
    assert ds["kind"] == "DaemonSet" and ds["metadata"]["name"] == "cifar-s3-cache-warm"
    assert ds["spec"]["selector"]["matchLabels"] == ds["spec"]["template"]["metadata"]["labels"]
    assert pod["tolerations"] == worker_pod["tolerations"]
    assert [c["command"] for c in pod["initContainers"]] == [c["command"] for c in worker_pod["initContainers"]]
    assert validate_pod_template(ds["spec"]["template"], "spec.template") == []
    with pytest.raises(ValueError, match="nothing to warm"):
        renderer.warm_daemonset(load_job(GOLDEN / "gpu-1x8" / "job.yaml"))


def test_run_policy_kueue_pull_secrets_and_secret_references():
    out = rendered("gpu-4x8-rdma")
    job = out["mpijob"]
    assert job["spec"]["runPolicy"] == {"cleanPodPolicy": "Running", "ttlSecondsAfterFinished": 86400,
                                        "backoffLimit": 2, "activeDeadlineSeconds": 259200, "suspend": True}
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    pod = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]
    assert pod["imagePullSecrets"] == [{"name": "registry-creds"}] and pod["serviceAccountName"] == "trainer"
    env = env_of(pod["containers"][0])
    assert env["WANDB_API_KEY"] == {"secretKeyRef": {"name": "wandb", "key": "api-key"}}
    assert "WANDB_API_KEY" in pod["containers"][0]["command"]


def test_the_configmap_carries_the_job_file_that_trains():
    out = rendered("gpu-4x8-rdma")
    carried = yaml.safe_load(out["configmap"]["data"]["job.yaml"])
    assert load_job(GOLDEN / "gpu-4x8-rdma" / "job.yaml").model_dump(mode="json") == carried


@pytest.mark.parametrize("override,field,words", [
    (["resources.gpus=12"], "resources", "do not fill whole nodes"),
    (["resources.gpus=16", "resources.workers=3"], "resources", "workers (3) disagrees"),
    (["resources.rdma={enabled: true, resource: 'not a resource'}"], "resources.rdma.resource", "extended resource"),
    (["kubernetes.secret_env={bad-name: {secret: s, key: k}}"], "kubernetes.secret_env", "environment variable"),
    (["kubernetes.clean_pod_policy=Sometimes"], "kubernetes.clean_pod_policy", "'None', 'Running' or 'All'"),
    (["resources.shm_size=lots"], "resources.shm_size", "Kubernetes quantity"),
])
def test_bad_cluster_settings_exit_2_and_write_nothing(tmp_path, override, field, words):
    out = tmp_path / "out"
    args = [a for o in override for a in ("--set", o)]
    proc = cli("render", GOLDEN / "gpu-1x8" / "job.yaml", "-o", out, *args)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"  {field}:" in proc.stderr and words in " ".join(proc.stderr.split()), proc.stderr
    assert not out.exists()



@pytest.fixture(scope="module")
def crd_schema():
    crd = ROOT.parent / "shared" / "k8s" / "mpijob-crd.yaml"
    if not crd.is_file():
        if os.environ.get("CI"):
            pytest.fail(f"the MPIJob CRD is expected at {crd} (../shared/k8s beside the clone)")
        pytest.skip(f"the upstream MPIJob CRD is not at {crd} (only the CI layout has ../shared)")
    return mv.load_crd_schema(crd)


@pytest.mark.parametrize("case", CASES)
def test_rendered_mpijob_passes_the_crd_the_operator_rules_and_the_pod_schema(case, crd_schema):
    job = rendered(case)["mpijob"]
    assert mv.validate_mpijob(job, schema=crd_schema, pod_schema=True) == []
    assert mv.validate_mpijob(job, pod_schema=True) == []  # hvdk8s's own rules agree


@pytest.mark.parametrize("case", CASES)
def test_validate_accepts_rendered_yaml_and_names_problems_in_broken_yaml(case, tmp_path, crd_schema):
    crd = ROOT.parent / "shared" / "k8s" / "mpijob-crd.yaml"
    good = cli("validate", GOLDEN / case / "mpijob.yaml", "--crd", crd)
    assert good.returncode == 0 and "valid MPIJob" in good.stdout, good.stderr
    job = yaml.safe_load((GOLDEN / case / "mpijob.yaml").read_text())
    job["spec"]["slotPerWorker"] = 8                                   # a typo a 1.20 server would drop
    job["spec"]["mpiReplicaSpecs"]["Launcher"]["replicas"] = 2
    containers(job, "Worker")[0]["securityContext"]["privileged"] = True
    broken = tmp_path / "broken.yaml"
    broken.write_text(yaml.safe_dump(job))
    for extra in ([], ["--crd", str(crd)]):
        proc = cli("validate", broken, *extra)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr
        for path in ("spec.slotPerWorker", "spec.mpiReplicaSpecs.Launcher.replicas",
                     "spec.mpiReplicaSpecs.Worker.template.spec.containers[0].securityContext.privileged"):
            assert f"  {path}:" in proc.stderr, proc.stderr


def test_cache_warm_command_prints_the_daemonset_or_says_why_not():
    proc = cli("cache", "warm", GOLDEN / "s3-cached" / "job.yaml")
    assert proc.returncode == 0, proc.stderr
    ds = yaml.safe_load(proc.stdout)
    assert ds["kind"] == "DaemonSet" and ds == renderer.warm_daemonset(load_job(GOLDEN / "s3-cached" / "job.yaml"))
    proc = cli("cache", "warm", GOLDEN / "cpu" / "job.yaml")
    assert proc.returncode == 2 and "nothing to warm" in proc.stderr and "Traceback" not in proc.stderr
