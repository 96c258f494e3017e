"""MPIJob rendering: golden files, determinism, topology, networking, storage, scheduling, and validity of
what is rendered (the MPIJob CRD's schema, the operator's rules, Pod specs, kustomize)."""
import os
import re
import shutil
import subprocess

import pytest
import yaml

from conftest import OPERATOR_CRD, ROOT, cli, invoke
from hvdk8s.mpijob import render as renderer
from hvdk8s.mpijob import validate as mv
from hvdk8s.mpijob.checks import ClusterJobError
from hvdk8s.spec import JobFileError, load_job, with_backend_defaults

GOLDEN = ROOT / "tests" / "golden"
CASES = sorted(p.name for p in GOLDEN.iterdir() if (p / "job.yaml").is_file())
UPDATE = os.environ.get("HVDK8S_UPDATE_GOLDEN") == "1"  # regenerate after an intended change
WAIT = ["python", "-m", "hvdk8s.launch.workers", "--port", "2222"]


def rendered(case: str, *overrides: str) -> dict:
    configmap, job = renderer.render(load_job(GOLDEN / case / "job.yaml", list(overrides)))
    return {"configmap": configmap, "mpijob": job}


def job_of(case: str, *overrides: str) -> dict:
    return rendered(case, *overrides)["mpijob"]


def pod_of(job, role):
    return job["spec"]["mpiReplicaSpecs"][role]["template"]["spec"]


def containers(job, role):
    return pod_of(job, role)["containers"]


def env_of(container):
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def mpirun(command):
    """The mpirun part of the launcher's command (after the wait for the workers)."""
    assert command[:len(WAIT)] == WAIT and "--" in command, command
    return command[command.index("--") + 1:]


def mca(command) -> dict:
    cmd = mpirun(command)
    return {cmd[i + 1]: cmd[i + 2] for i, a in enumerate(cmd) if a == "-mca"}


def cluster_problems(case: str, *overrides: str) -> dict:
    """{field path: message} of a job that `render` refuses for a cluster (it must be valid as a job file)."""
    spec = load_job(GOLDEN / case / "job.yaml", list(overrides))
    with pytest.raises(ClusterJobError) as e:
        renderer.render(spec)
    assert isinstance(e.value, JobFileError)
    return dict(e.value.problems)


def field_problems(case: str, *overrides: str) -> dict:
    """{field path: message} of a job file that does not validate at all."""
    with pytest.raises(JobFileError) as e:
        load_job(GOLDEN / case / "job.yaml", list(overrides))
    return dict(e.value.problems)


# --- golden files and tools --------------------------------------------------------------------------

def test_golden_cases_cover_the_required_shapes():
    assert CASES == ["cpu", "gpu-1x8", "gpu-4x8-rdma", "gpu-4x8-tcp", "nfs-cached", "s3-cached", "single-node"]


@pytest.mark.parametrize("case", CASES)
def test_render_matches_golden_files_and_is_byte_identical_twice(case, tmp_path):
    if UPDATE:
        renderer.write_directory(load_job(GOLDEN / case / "job.yaml"), GOLDEN / case)
    proc = cli("render", GOLDEN / case / "job.yaml", "-d", tmp_path)
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


def test_readme_applies_the_rendered_directory_with_kustomize():
    readme = (ROOT / "README.md").read_text()
    assert "kubectl apply -k deploy/" in readme  # the -d directory holds a kustomization.yaml
    assert not re.search(r"kubectl apply -f deploy/", readme)


# --- topology ------------------------------------------------------------------------------------------

def test_four_nodes_of_eight_gpus():
    job = job_of("gpu-4x8-rdma")
    spec = job["spec"]
    assert spec["slotsPerWorker"] == 8 and spec["mpiReplicaSpecs"]["Worker"]["replicas"] == 4
    worker = containers(job, "Worker")[0]
    assert worker["resources"]["limits"]["nvidia.com/gpu"] == "8"
    pod = pod_of(job, "Worker")
    term = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"] == {"hvdk8s.io/job": "lm-4x8-rdma", "hvdk8s.io/role": "worker"}
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    launcher = containers(job, "Launcher")[0]
    cmd = mpirun(launcher["command"])
    assert cmd[:7] == ["mpirun", "-np", "32", "-bind-to", "none", "-map-by", "slot"]
    assert cmd[-3:] == ["hvdk8s", "train", "/etc/hvdk8s/job.yaml"]
    assert "nvidia.com/gpu" not in launcher["resources"]["limits"]
    # every variable the ranks get is forwarded to them by mpirun
    forwarded = {cmd[i + 1] for i, a in enumerate(cmd) if a == "-x"}
    assert set(env_of(launcher)) <= forwarded and {"PATH", "LD_LIBRARY_PATH"} <= forwarded


def test_one_node_of_eight_gpus():
    job = job_of("gpu-1x8")
    assert job["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] == 1 and job["spec"]["slotsPerWorker"] == 8
    assert "HOROVOD_HIERARCHICAL_ALLREDUCE" not in env_of(containers(job, "Launcher")[0])


@pytest.mark.parametrize("overrides, shown", [
    ((), "fp16"),  # the cpu case: 2 workers, so Horovod's cross_size is 2
    (("resources.workers=1",), "none"),
    (("resources.workers=2", "training.compression=none"), "none"),  # a choice the file makes stays
    (("training.elastic.min_workers=1", "training.elastic.max_workers=2"), "auto"),  # resolved at each start
])
def test_the_configmap_shows_the_compression_auto_picks(overrides, shown):
    spec = load_job(GOLDEN / "cpu" / "job.yaml", list(overrides))
    handed = yaml.safe_load(rendered("cpu", *overrides)["configmap"]["data"]["job.yaml"])
    assert handed["training"]["compression"] == shown
    if shown != "auto":  # what the ranks' own resolution (hvdk8s.compression, cross_size = workers) gives
        from hvdk8s import compression
        assert shown == compression.resolve(spec.training.compression, nodes=spec.resources.workers or 1)


def test_cpu_job_uses_ranks_per_worker_and_no_gpu_or_nccl():
    job = job_of("cpu")
    assert job["spec"]["slotsPerWorker"] == 4 and job["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] == 2
    worker = containers(job, "Worker")[0]
    assert "nvidia.com/gpu" not in worker["resources"]["limits"]
    launcher = containers(job, "Launcher")[0]
    env = env_of(launcher)
    assert env["OMP_NUM_THREADS"] == "2" and not any(k.startswith("NCCL_") for k in env)
    assert mpirun(launcher["command"])[2] == "8"
    affinity = pod_of(job, "Worker")["affinity"]["podAntiAffinity"]
    assert "preferredDuringSchedulingIgnoredDuringExecution" in affinity


def forwarded_names(job) -> list:
    cmd = mpirun(containers(job, "Launcher")[0]["command"])
    return [cmd[i + 1] for i, a in enumerate(cmd) if a == "-x"]


@pytest.mark.parametrize("case", CASES)
def test_ld_library_path_is_forwarded_where_the_image_sets_it(case):
    """GPU jobs forward the CUDA image's LD_LIBRARY_PATH; a CPU job's image sets none, and mpirun would begin
    its log with `Warning: could not find environment variable "LD_LIBRARY_PATH"` (docs/k8s-stack.md section
    6, difference 4). A CPU job that sets it in kubernetes.env forwards it, once."""
    job = job_of(case)
    names = forwarded_names(job)
    gpus = "nvidia.com/gpu" in containers(job, "Launcher" if case == "single-node" else "Worker")[0]["resources"]["limits"]
    assert names[0] == "PATH" and ("LD_LIBRARY_PATH" in names) == gpus, names
    assert len(names) == len(set(names)), names
    if not gpus:
        names = forwarded_names(job_of(case, "kubernetes.env={LD_LIBRARY_PATH: /opt/lib}"))
        assert names.count("LD_LIBRARY_PATH") == 1, names


def test_workers_beyond_32_bits_are_a_field_error_at_validate(tmp_path):
    problems = field_problems("cpu", f"resources.workers={2**31}")
    assert list(problems) == ["resources.workers"] and "2147483647" in problems["resources.workers"]
    assert list(field_problems("cpu", f"resources.workers={2**30}", "resources.ranks_per_worker=4")) == ["resources"]
    proc = cli("validate", GOLDEN / "cpu" / "job.yaml", "--set", f"resources.workers={2**31}")
    assert proc.returncode == 2 and "  resources.workers:" in proc.stderr and "Traceback" not in proc.stderr


# --- item 4: hierarchical allreduce only where it can help ------------------------------------------------

@pytest.mark.parametrize("case", CASES)
def test_no_job_gets_hierarchical_allreduce_unless_it_asks(case):
    assert "HOROVOD_HIERARCHICAL_ALLREDUCE" not in env_of(containers(job_of(case), "Launcher")[0])


def test_hierarchical_allreduce_is_opt_in_for_multi_node_tcp_jobs_only():
    env = env_of(containers(job_of("gpu-4x8-tcp", "resources.hierarchical_allreduce=true"), "Launcher")[0])
    assert env["HOROVOD_HIERARCHICAL_ALLREDUCE"] == "1"
    rdma = field_problems("gpu-4x8-rdma", "resources.hierarchical_allreduce=true")
    assert "host-memory MPI allreduce over TCP" in rdma["resources"]
    assert "more than one node" in field_problems("gpu-1x8", "resources.hierarchical_allreduce=true")["resources"]
    assert "more than one node" in field_problems("cpu", "resources.hierarchical_allreduce=true")["resources"]


# --- items 3 and 6: RDMA as non-root, interfaces --------------------------------------------------------

def test_rdma_on_needs_no_capability_checks_the_locked_memory_limit_and_never_falls_back():
    job = job_of("gpu-4x8-rdma")
    template = job["spec"]["mpiReplicaSpecs"]["Worker"]["template"]
    worker = template["spec"]["containers"][0]
    assert worker["resources"]["limits"]["rdma/rdma_shared_device_a"] == "1"
    # IPC_LOCK is never effective for the non-root ranks; it is not asked for (and baseline forbids it)
    assert worker["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert worker["securityContext"]["privileged"] is False
    assert template["metadata"]["annotations"]["k8s.v1.cni.cncf.io/networks"] == "rdma-net"
    launcher = containers(job, "Launcher")[0]
    env = env_of(launcher)
    assert {k: env[k] for k in env if k.startswith("NCCL_")} == {
        "NCCL_IB_DISABLE": "0", "NCCL_NET": "IB", "NCCL_IB_HCA": "mlx5", "NCCL_IB_GID_INDEX": "3",
        "NCCL_NET_GDR_LEVEL": "PHB", "NCCL_SOCKET_IFNAME": "eth0"}
    cmd = mpirun(launcher["command"])
    # each rank runs behind the locked-memory check, which execs the real command
    assert cmd[-7:] == ["python", "-m", "hvdk8s.launch.memlock", "--", "hvdk8s", "train", "/etc/hvdk8s/job.yaml"]


def test_rdma_off():
    job = job_of("gpu-4x8-tcp")
    worker = containers(job, "Worker")[0]
    assert not any(k.startswith("rdma/") for k in worker["resources"]["limits"])
    assert worker["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    launcher = containers(job, "Launcher")[0]
    env = env_of(launcher)
    assert env["NCCL_IB_DISABLE"] == "1" and env["NCCL_SOCKET_IFNAME"] == "eth0" and "NCCL_NET" not in env
    assert "hvdk8s.launch.memlock" not in launcher["command"]
    assert job["spec"]["runPolicy"]["cleanPodPolicy"] == "All"


def interfaces_of_worker(spec) -> list:
    return spec.resources.rdma.pod_interfaces


@pytest.mark.parametrize("case", CASES)
def test_openmpi_and_nccl_use_interfaces_the_pods_have(case):
    spec = load_job(GOLDEN / case / "job.yaml")
    launcher = containers(job_of(case), "Launcher")[0]
    pins = mca(launcher["command"])
    # OpenMPI's runtime and TCP transport both on the pod network, where the launcher and the DNS names are
    assert pins["oob_tcp_if_include"] == pins["btl_tcp_if_include"] == "eth0"
    nccl = env_of(launcher).get("NCCL_SOCKET_IFNAME")
    assert nccl is None or nccl in interfaces_of_worker(spec)


def test_socket_interface_must_exist_in_the_pods():
    problem = field_problems("gpu-4x8-tcp", "resources.rdma.socket_ifname=ens5")["resources.rdma"]
    assert "'ens5' is not an interface of the worker pods" in problem and "eth0" in problem
    # with RDMA on and a Multus network attached, its interface (net1, or the one named) may carry NCCL's sockets
    job = job_of("gpu-4x8-rdma", "resources.rdma.socket_ifname=net1")
    assert env_of(containers(job, "Launcher")[0])["NCCL_SOCKET_IFNAME"] == "net1"
    assert mca(containers(job, "Launcher")[0]["command"])["oob_tcp_if_include"] == "eth0"
    named = load_job(GOLDEN / "gpu-4x8-rdma" / "job.yaml", ["resources.rdma.networks=ns/rdma-a@ib0, rdma-b"])
    assert named.resources.rdma.pod_interfaces == ["eth0", "ib0", "net2"]
    assert "network 1" in field_problems("gpu-4x8-rdma", "resources.rdma.networks=Bad_Name")["resources.rdma.networks"]


def test_hvdk8s_variables_cannot_be_overridden_by_the_job_env():
    problems = cluster_problems("gpu-4x8-tcp", "kubernetes.env={NCCL_SOCKET_IFNAME: ens5, NCCL_DEBUG: INFO}")
    assert list(problems) == ["kubernetes.env.NCCL_SOCKET_IFNAME"]  # NCCL_DEBUG is the user's to set
    problems = cluster_problems("cpu", "kubernetes.secret_env={PATH: {secret: s, key: k}}")
    assert list(problems) == ["kubernetes.secret_env.PATH"]
    assert "both env and secret_env" in field_problems(
        "cpu", "kubernetes.env={A: x}", "kubernetes.secret_env={A: {secret: s, key: k}}")["kubernetes"]


# --- items 1 and 7: storage and caches ---------------------------------------------------------------

def test_checkpoints_need_a_writable_volume():
    problems = cluster_problems("gpu-1x8", "kubernetes.volumes=[]")
    assert list(problems) == ["training.checkpoint.dir"] and "lost with the pod" in problems["training.checkpoint.dir"]
    problems = cluster_problems("gpu-1x8", "kubernetes.volumes=[{name: ckpt, mount_path: /ckpt, pvc: c, "
                                           "read_only: true}]")
    assert "read-only" in problems["training.checkpoint.dir"]
    problems = cluster_problems("gpu-1x8", "training.checkpoint.dir=checkpoints/x")
    assert "is relative" in problems["training.checkpoint.dir"]
    problems = cluster_problems("gpu-1x8", "training.checkpoint.dir=/ckptx/a")  # /ckptx is not under /ckpt
    assert "/ckptx/a is on no volume" in problems["training.checkpoint.dir"]


def test_render_refuses_an_uncovered_checkpoint_from_the_cli_and_writes_nothing(tmp_path):
    out = tmp_path / "out"
    proc = cli("render", GOLDEN / "gpu-1x8" / "job.yaml", "--set", "kubernetes.volumes=[]", "-d", out)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "internal error" not in proc.stderr
    assert "  training.checkpoint.dir:" in proc.stderr and not out.exists()


def test_volumes_are_mounted_where_ranks_run_and_only_there():
    job = job_of("gpu-4x8-rdma")
    worker_pod = pod_of(job, "Worker")
    volumes = {v["name"]: v for v in worker_pod["volumes"]}
    assert volumes["ckpt"] == {"name": "ckpt", "persistentVolumeClaim": {"claimName": "lm-checkpoints"}}
    assert volumes["hf-cache"] == {"name": "hf-cache", "nfs": {"server": "nfs.research.example.com",
                                                              "path": "/exports/hf"}}
    mounts = {m["name"]: m for m in worker_pod["containers"][0]["volumeMounts"]}
    assert mounts["ckpt"] == {"name": "ckpt", "mountPath": "/ckpt"}
    assert "volumes" not in pod_of(job, "Launcher")  # mpirun needs none of them


def test_a_volume_marked_launcher_is_mounted_in_the_launcher_too():
    """`launcher: true` (software an elastic job's horovodrun needs from a volume): the launcher pod gets
    that volume and its mount, as the workers do, and no other."""
    job = job_of("gpu-1x8", "kubernetes.volumes=[{name: ckpt, mount_path: /ckpt, pvc: c}, "
                            "{name: sw, mount_path: /sw, host_path: /opt/sw, read_only: true, launcher: true}]")
    launcher = pod_of(job, "Launcher")
    assert launcher["volumes"] == [{"name": "sw", "hostPath": {"path": "/opt/sw", "type": "Directory"}}]
    assert launcher["containers"][0]["volumeMounts"] == [{"name": "sw", "mountPath": "/sw", "readOnly": True}]
    assert {v["name"] for v in pod_of(job, "Worker")["volumes"]} >= {"ckpt", "sw"}


def test_a_host_path_volume_mounts_an_existing_directory_where_the_ranks_run():
    job = job_of("gpu-1x8", "kubernetes.volumes=[{name: ckpt, mount_path: /ckpt, pvc: c}, "
                            "{name: scratch, mount_path: /scratch, host_path: /mnt/nvme/scratch}, "
                            "{name: ref, mount_path: /ref, host_path: /mnt/ref, read_only: true}]")
    pod = pod_of(job, "Worker")
    volumes = {v["name"]: v for v in pod["volumes"]}
    # type Directory: the kubelet refuses to start a pod whose directory is missing rather than creating a
    # root-owned one that the ranks (uid 1000) could not write
    assert volumes["scratch"] == {"name": "scratch", "hostPath": {"path": "/mnt/nvme/scratch", "type": "Directory"}}
    assert volumes["ref"] == {"name": "ref", "hostPath": {"path": "/mnt/ref", "type": "Directory"}}
    mounts = {m["name"]: m for m in pod["containers"][0]["volumeMounts"]}
    assert mounts["scratch"] == {"name": "scratch", "mountPath": "/scratch"}
    assert mounts["ref"] == {"name": "ref", "mountPath": "/ref", "readOnly": True}


def test_read_only_nfs_dataset_synced_by_the_init_container_from_its_mount():
    job = job_of("nfs-cached")
    pod = pod_of(job, "Worker")
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["datasets"]["nfs"] == {"server": "10.0.0.20", "path": "/exports/datasets", "readOnly": True}
    permissions, sync = pod["initContainers"]
    assert sync["command"][:5] == ["hvdk8s", "cache", "sync", "/nfs/datasets/imagenet-shards", "/var/cache/hvdk8s"]
    assert {"name": "datasets", "mountPath": "/nfs/datasets", "readOnly": True} in sync["volumeMounts"]
    problems = cluster_problems("nfs-cached", "kubernetes.volumes=[{name: ckpt, mount_path: /ckpt, pvc: c}]")
    assert list(problems) == ["dataset.path"] and "no pod has it" in problems["dataset.path"]


def test_an_uncached_local_dataset_is_read_from_a_volume():
    problems = cluster_problems("gpu-1x8", "dataset={path: /data/shards}")
    assert list(problems) == ["dataset.path"]
    job = job_of("gpu-1x8", "dataset={path: /data/shards}",
                 "kubernetes.volumes=[{name: ckpt, mount_path: /ckpt, pvc: c}, "
                 "{name: data, mount_path: /data, pvc: d, read_only: true}]")
    pod = pod_of(job, "Worker")
    assert "initContainers" not in pod and not any("hostPath" in v for v in pod["volumes"])
    assert {v["name"]: v for v in pod["volumes"]}["data"]["persistentVolumeClaim"] == {"claimName": "d",
                                                                                       "readOnly": True}


@pytest.mark.parametrize("override, field, words", [
    (["kubernetes.volumes=[{name: job, mount_path: /x, pvc: c}]"], "kubernetes.volumes.0.name", "taken"),
    (["kubernetes.volumes=[{name: a, mount_path: /etc, pvc: c}]"], "kubernetes.volumes.0.mount_path", "/etc/hvdk8s"),
    (["kubernetes.volumes=[{name: a, mount_path: /opt, pvc: c}]"], "kubernetes.volumes.0.mount_path", "hide"),
    (["kubernetes.volumes=[{name: a, mount_path: x/y, pvc: c}]"], "kubernetes.volumes.0.mount_path", "absolute"),
    (["kubernetes.volumes=[{name: a, mount_path: /a}]"], "kubernetes.volumes.0", "exactly one"),
    (["kubernetes.volumes=[{name: a, mount_path: /a, pvc: c, host_path: /b}]"], "kubernetes.volumes.0",
     "exactly one"),
    (["kubernetes.volumes=[{name: a, mount_path: /a, pvc: c}, {name: a, mount_path: /b, pvc: c}]"],
     "kubernetes.volumes", "same name"),
    (["kubernetes.volumes=[{name: a, mount_path: /var/cache/hvdk8s/x, pvc: c}]"], "kubernetes", "cache_dir"),
    # another namespace's cached datasets lie below cache_dir on the node
    (["kubernetes.volumes=[{name: a, mount_path: /a, host_path: /var/cache/hvdk8s/other-team}]"], "kubernetes",
     "overlaps cache_dir"),
    (["kubernetes.volumes=[{name: a, mount_path: /a, host_path: /var}]"], "kubernetes", "overlaps cache_dir"),
    (["kubernetes.volumes=[{name: a, mount_path: /a, nfs: {server: 'x y', path: /e}}]"],
     "kubernetes.volumes.0.nfs.server", "host name"),
    (["kubernetes.run_as_user=2000"], "kubernetes.run_as_user", "uid 1000"),
    (["kubernetes.namespace=Team_A"], "kubernetes.namespace", "DNS-1123 label"),
    (["kubernetes.node_selector={a: 'b c'}"], "kubernetes.node_selector", "letters"),
    (["kubernetes.queue=q/1"], "kubernetes.queue", "letters"),
    (["kubernetes.cache_dir=/home/mpiuser/cache"], "kubernetes.cache_dir", "overlaps"),
])
def test_bad_volume_and_pod_settings_are_field_errors(tmp_path, override, field, words):
    problems = field_problems("gpu-1x8", *override)
    key = next((k for k in problems if k.replace("[", ".").replace("]", "") == field), None)
    assert key is not None and words in problems[key], problems


@pytest.mark.parametrize("value, ok", [
    ("/mnt/hf-cache/hub", True), ("/home/mpiuser/.cache/hf", True), ("/tmp/hf", True), ("/dev/shm/hf", True),
    ("/var/cache/hvdk8s/hf", False), ("/root/.cache", False), ("/opt/hf", False), ("hf", False),
    ("/home/mpiuser/.ssh/hf", False), ("/etc/hvdk8s/hf", False),
])
def test_caches_point_where_the_non_root_ranks_can_write(value, ok):
    overrides = ("kubernetes.env.HF_HOME=" + value,)
    if ok:
        assert env_of(containers(job_of("gpu-4x8-rdma", *overrides), "Launcher")[0])["HF_HOME"] == value
    else:
        problems = cluster_problems("gpu-4x8-rdma", *overrides)
        assert list(problems) == ["kubernetes.env.HF_HOME"] and "not writable" in problems["kubernetes.env.HF_HOME"]


def test_a_read_only_volume_is_no_place_for_a_cache():
    problems = cluster_problems("nfs-cached", "kubernetes.env={TORCH_HOME: /nfs/datasets/torch}")
    assert list(problems) == ["kubernetes.env.TORCH_HOME"]


# --- item 5: only what a job needs; the shared cache per namespace -----------------------------------

@pytest.mark.parametrize("case", CASES)
def test_every_pod_runs_non_root_under_the_runtime_seccomp_profile(case):
    job = job_of(case)
    for role, replica in job["spec"]["mpiReplicaSpecs"].items():
        pod = replica["template"]["spec"]
        assert pod["securityContext"] == {"runAsUser": 1000, "runAsGroup": 1000, "runAsNonRoot": True,
                                          "fsGroup": 1000, "fsGroupChangePolicy": "OnRootMismatch",
                                          "seccompProfile": {"type": "RuntimeDefault"}}, role
        for c in pod["containers"]:
            assert c["securityContext"] == {"privileged": False, "allowPrivilegeEscalation": False,
                                            "capabilities": {"drop": ["ALL"]}}, (role, c["name"])


@pytest.mark.parametrize("case", CASES)
def test_a_hostpath_only_for_a_cached_dataset_or_a_host_path_volume(case):
    spec = load_job(GOLDEN / case / "job.yaml")
    for replica in job_of(case)["spec"]["mpiReplicaSpecs"].values():
        pod = replica["template"]["spec"]
        host_paths = [v["name"] for v in pod.get("volumes", []) if "hostPath" in v]
        wanted = (["dataset-cache"] if spec.cached_dataset and "initContainers" in pod else [])
        assert host_paths == wanted
        assert ("initContainers" in pod) == bool(spec.cached_dataset and host_paths)


def test_shm_start_policy_readiness():
    spec = job_of("gpu-4x8-rdma")["spec"]
    assert spec["launcherCreationPolicy"] == "WaitForWorkersReady"
    assert spec["sshAuthMountPath"] == "/home/mpiuser/.ssh"
    pod = spec["mpiReplicaSpecs"]["Worker"]["template"]["spec"]
    shm = next(v for v in pod["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "128Gi"}
    assert pod["containers"][0]["readinessProbe"]["tcpSocket"]["port"] == 2222
    assert "initContainers" not in pod  # a built-in dataset needs no cache sync


def test_cached_dataset_is_synced_by_init_containers_before_the_ranks():
    job = job_of("s3-cached")
    pod = pod_of(job, "Worker")
    permissions, sync = pod["initContainers"]
    assert permissions["command"] == ["chown", "1000:1000", "/var/cache/hvdk8s"]
    assert permissions["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN"]}
    assert permissions["securityContext"]["privileged"] is False
    assert sync["command"] == ["hvdk8s", "cache", "sync", "s3://datasets/cifar10-shards", "/var/cache/hvdk8s",
                               "--dataset-version", "2024-06", "--quota", "500Gi", "--lease", "1500s"]
    assert "runAsUser" not in sync["securityContext"]  # the pod's non-root user
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in sync["env"]}
    assert env == {"AWS_ENDPOINT_URL": "https://minio.storage.svc:9000",
                   "AWS_ACCESS_KEY_ID": {"secretKeyRef": {"name": "minio-creds", "key": "AWS_ACCESS_KEY_ID"}},
                   "AWS_SECRET_ACCESS_KEY": {"secretKeyRef": {"name": "minio-creds", "key": "AWS_SECRET_ACCESS_KEY"}},
                   "AWS_SESSION_TOKEN": {"secretKeyRef": {"name": "minio-creds", "key": "AWS_SESSION_TOKEN",
                                                          "optional": True}}}
    assert all(m["mountPath"] == "/var/cache/hvdk8s" for c in (permissions, sync) for m in c["volumeMounts"])
    launcher = containers(job, "Launcher")[0]
    assert env_of(launcher)["HVDK8S_CACHE_DIR"] == "/var/cache/hvdk8s"  # forwarded to the ranks (-x)
    assert "HVDK8S_CACHE_DIR" in launcher["command"]


@pytest.mark.parametrize("case,wait", [("s3-cached", 60), ("nfs-cached", 86400)])
def test_the_init_container_leases_the_dataset_through_the_launchers_wait_for_workers(case, wait):
    """The init container exits before the ranks take their hold (after the launcher's wait for the
    workers): its sync leases the dataset for that wait plus 600 s, in the CLI's own duration syntax."""
    import click

    from hvdk8s.cli.options import duration

    job = job_of(case, f"kubernetes.worker_wait_seconds={wait}")
    command = pod_of(job, "Worker")["initContainers"][1]["command"]
    assert command[:3] == ["hvdk8s", "cache", "sync"] and command.count("--lease") == 1
    lease = command[command.index("--lease") + 1]
    assert duration(click.Context(click.Command("x")), None, lease) == wait + 600
    ds = renderer.warm_daemonset(load_job(GOLDEN / case / "job.yaml", [f"kubernetes.worker_wait_seconds={wait}"]))
    assert ds["spec"]["template"]["spec"]["initContainers"][1]["command"] == command


def test_each_namespace_has_its_own_cache_directory_on_the_node():
    def cache_host_path(namespace):
        pod = pod_of(job_of("s3-cached", f"kubernetes.namespace={namespace}"), "Worker")
        volume = next(v for v in pod["volumes"] if v["name"] == "dataset-cache")
        mount = next(m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "dataset-cache")
        return volume["hostPath"]["path"], mount["mountPath"]

    (path_a, mount_a), (path_b, mount_b) = cache_host_path("team-a"), cache_host_path("team-b")
    assert (path_a, path_b) == ("/var/cache/hvdk8s/team-a", "/var/cache/hvdk8s/team-b")
    # a pod mounts only its namespace's directory (neither contains the other), at the same place in the pod
    assert not path_a.startswith(path_b + "/") and not path_b.startswith(path_a + "/")
    assert mount_a == mount_b == "/var/cache/hvdk8s"
    ds = renderer.warm_daemonset(load_job(GOLDEN / "s3-cached" / "job.yaml", ["kubernetes.namespace=team-a"]))
    assert ds["spec"]["template"]["spec"]["volumes"][0]["hostPath"]["path"] == "/var/cache/hvdk8s/team-a"


def test_cache_warm_daemonset_fills_the_job_nodes():
    from hvdk8s.mpijob.validate import validate_pod_template

    spec = load_job(GOLDEN / "s3-cached" / "job.yaml")
    ds = renderer.warm_daemonset(spec)
    worker_pod = pod_of(renderer.mpijob(spec), "Worker")
    pod = ds["spec"]["template"]["spec"]
    assert ds["kind"] == "DaemonSet" and ds["metadata"]["name"] == "cifar-s3-cache-warm"
    assert ds["spec"]["selector"]["matchLabels"] == ds["spec"]["template"]["metadata"]["labels"]
    assert pod["tolerations"] == worker_pod["tolerations"]
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert [c["command"] for c in pod["initContainers"]] == [c["command"] for c in worker_pod["initContainers"]]
    assert validate_pod_template(ds["spec"]["template"], "spec.template") == []
    nfs = renderer.warm_daemonset(load_job(GOLDEN / "nfs-cached" / "job.yaml"))
    assert [v["name"] for v in nfs["spec"]["template"]["spec"]["volumes"]] == ["dataset-cache", "datasets"]
    with pytest.raises(ValueError, match="nothing to warm"):
        renderer.warm_daemonset(load_job(GOLDEN / "gpu-1x8" / "job.yaml"))


# --- item 2: Kueue and the launcher's wait ----------------------------------------------------------

@pytest.mark.parametrize("case", CASES)
def test_the_launcher_waits_for_every_worker_before_mpirun(case):
    spec = load_job(GOLDEN / case / "job.yaml")
    command = containers(job_of(case), "Launcher")[0]["command"]
    assert command[:len(WAIT)] == WAIT
    assert command[command.index("--timeout") + 1] == str(spec.kubernetes.worker_wait_seconds)
    assert mpirun(command)[0] == "mpirun"


@pytest.mark.parametrize("case", CASES)
def test_a_failed_launcher_is_retried_in_a_new_pod_that_keeps_its_log(case):
    """restartPolicy Never on the launcher (the operator's default is OnFailure): each retry is a new pod and
    the Job keeps the failed ones, so the failing rank can still be read from a failed job's launcher log
    (with OnFailure the container restarts in place and the Job controller deletes the pod at its backoff
    limit: docs/k8s-stack.md section 6, difference 5). The operator's pod carries it as rendered."""
    from hvdk8s.mpijob import operator

    job = job_of(case)
    assert job["spec"]["mpiReplicaSpecs"]["Launcher"]["restartPolicy"] == "Never"
    assert operator.pods(job)["Launcher"][0]["spec"]["restartPolicy"] == "Never"


def test_kueue_job_is_created_suspended_and_still_waits_for_its_workers():
    job = job_of("gpu-4x8-rdma")
    assert job["spec"]["runPolicy"] == {"cleanPodPolicy": "Running", "ttlSecondsAfterFinished": 86400,
                                        "backoffLimit": 2, "activeDeadlineSeconds": 259200, "suspend": True}
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    assert containers(job, "Launcher")[0]["command"][:3] == ["python", "-m", "hvdk8s.launch.workers"]
    pod = pod_of(job, "Launcher")
    assert pod["imagePullSecrets"] == [{"name": "registry-creds"}] and pod["serviceAccountName"] == "trainer"
    env = env_of(pod["containers"][0])
    assert env["WANDB_API_KEY"] == {"secretKeyRef": {"name": "wandb", "key": "api-key"}}
    assert "WANDB_API_KEY" in pod["containers"][0]["command"]


# --- beyond the anchors: scheduling ------------------------------------------------------------------

def test_gang_scheduling_counts_every_pod_and_starts_the_launcher_with_the_gang():
    job = job_of("nfs-cached")
    assert job["spec"]["runPolicy"]["schedulingPolicy"] == {"minAvailable": 3, "queue": "vision",
                                                            "scheduleTimeoutSeconds": 600}
    # WaitForWorkersReady would hold back the launcher the gang waits for: neither would ever start
    assert job["spec"]["launcherCreationPolicy"] == "AtStartup"
    for role in ("Launcher", "Worker"):
        assert pod_of(job, role)["priorityClassName"] == "training-high"
    problem = field_problems("nfs-cached", "kubernetes.scheduler_name=my-scheduler")["kubernetes"]
    assert "scheduler_name and scheduling_policy" in problem


def test_launcher_and_worker_placement():
    job = job_of("nfs-cached")
    launcher, worker = pod_of(job, "Launcher"), pod_of(job, "Worker")
    assert launcher["nodeSelector"] == {"node-role.example.com/cpu": "true"}
    assert launcher["tolerations"] == [{"key": "dedicated", "operator": "Equal", "value": "cpu",
                                        "effect": "NoSchedule"}]
    assert worker["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                                     {"key": "dedicated", "operator": "Equal", "value": "training",
                                      "effect": "NoSchedule"}]
    assert "nodeSelector" not in worker
    assert pod_of(job_of("cpu", "kubernetes.scheduler_name=volcano"), "Worker")["schedulerName"] == "volcano"
    assert "must have operator Exists" in field_problems(
        "cpu", "kubernetes.tolerations=[{value: x}]")["kubernetes.tolerations[0]"]
    assert "NoExecute" in field_problems(
        "cpu", "kubernetes.tolerations=[{key: a, operator: Exists, toleration_seconds: 5}]")["kubernetes.tolerations[0]"]


def test_a_single_node_job_can_run_its_ranks_in_the_launcher():
    job = job_of("single-node")
    spec = job["spec"]
    assert spec["runLauncherAsWorker"] is True and list(spec["mpiReplicaSpecs"]) == ["Launcher"]
    pod = pod_of(job, "Launcher")
    launcher = pod["containers"][0]
    assert launcher["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert "readinessProbe" not in launcher  # no sshd: mpirun starts ranks locally
    assert [p["name"] for p in launcher["ports"]] == ["metrics"]  # ...whose metrics it serves
    assert {m["mountPath"] for m in launcher["volumeMounts"]} == {"/dev/shm", "/etc/hvdk8s", "/ckpt"}
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert mpirun(launcher["command"])[:3] == ["mpirun", "-np", "8"]
    problems = cluster_problems("gpu-4x8-tcp", "kubernetes.run_launcher_as_worker=true")
    assert "this one has 4" in problems["kubernetes.run_launcher_as_worker"]
    problems = cluster_problems("single-node", "kubernetes.launcher={node_selector: {a: b}}")
    assert list(problems) == ["kubernetes.launcher"]


# --- what render writes is what the cluster accepts ---------------------------------------------------

def test_the_configmap_carries_the_job_file_that_trains():
    out = rendered("gpu-4x8-rdma")
    carried = yaml.safe_load(out["configmap"]["data"]["job.yaml"])
    spec = with_backend_defaults(load_job(GOLDEN / "gpu-4x8-rdma" / "job.yaml"), cluster=True)
    assert spec.training.compression == "auto" and carried["training"]["compression"] == "fp16"  # 4 nodes
    carried["training"]["compression"] = "auto"
    assert spec.model_dump(mode="json") == carried and carried["observability"]["metrics"]["enabled"] is True


@pytest.mark.parametrize("override,field,words", [
    (["resources.gpus=12"], "resources", "do not fill whole nodes"),
    (["resources.gpus=16", "resources.workers=3"], "resources", "workers (3) disagrees"),
    (["resources.rdma={enabled: true, resource: 'not a resource'}"], "resources.rdma.resource", "extended resource"),
    (["kubernetes.secret_env={bad-name: {secret: s, key: k}}"], "kubernetes.secret_env", "environment variable"),
    (["kubernetes.clean_pod_policy=Sometimes"], "kubernetes.clean_pod_policy", "'None', 'Running' or 'All'"),
    (["resources.shm_size=lots"], "resources.shm_size", "Kubernetes quantity"),
    (["kubernetes.run_as_user=0"], "kubernetes.run_as_user", "greater than or equal to 1"),
])
def test_bad_cluster_settings_exit_2_and_write_nothing(tmp_path, override, field, words):
    out = tmp_path / "out"
    args = [a for o in override for a in ("--set", o)]
    proc = cli("render", GOLDEN / "gpu-1x8" / "job.yaml", "-d", out, *args)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"  {field}:" in proc.stderr and words in " ".join(proc.stderr.split()), proc.stderr
    assert not out.exists()


# Job shapes beyond the golden files: every combination must render an MPIJob the cluster accepts.
SHAPES = [
    [], ["resources.hierarchical_allreduce=true"], ["kubernetes.priority_class=high"],
    ["kubernetes.scheduling_policy={}"], ["kubernetes.tolerations=[{operator: Exists}]"],
    ["kubernetes.launcher={node_selector: {pool: cpu}, tolerations: [{key: pool, operator: Equal, value: cpu}]}"],
    ["kubernetes.volumes=[{name: s, mount_path: /scratch, host_path: /mnt/nvme}]"],
    ["dataset={path: /scratch/shards, cache: true}",
     "kubernetes.volumes=[{name: s, mount_path: /scratch, host_path: /mnt/nvme, read_only: true}]"],
    ["resources.gpus=8", "kubernetes.run_launcher_as_worker=true"],
    ["kubernetes.env={HF_HOME: /tmp/hf, NCCL_DEBUG: INFO}", "kubernetes.worker_wait_seconds=60"],
    ["observability.metrics={enabled: false}"], ["observability.metrics={port: 9500, pod_monitor: true}"],
]


@pytest.mark.parametrize("overrides", SHAPES, ids=lambda o: ",".join(x.split("=")[0] for x in o) or "as-is")
def test_job_shapes_render_mpijobs_the_cluster_accepts(overrides, crd_schema):
    job = renderer.mpijob(load_job(GOLDEN / "gpu-4x8-tcp" / "job.yaml", overrides))
    assert mv.validate_mpijob(job, schema=crd_schema) == []
    assert mv.validate_mpijob(job) == []


@pytest.mark.parametrize("case", CASES)
def test_rendered_mpijob_passes_the_crd_the_operator_rules_and_the_pod_schema(case, crd_schema):
    job = job_of(case)
    assert mv.validate_mpijob(job, schema=crd_schema, pod_schema=True) == []
    assert mv.validate_mpijob(job, pod_schema=True) == []  # hvdk8s's own rules agree


@pytest.mark.parametrize("case", CASES)
def test_validate_accepts_rendered_yaml_and_names_problems_in_broken_yaml(case, tmp_path, crd_schema):
    """(In this process: the command's own code, without a Python start per call.)"""
    crd = OPERATOR_CRD
    good = invoke("validate", GOLDEN / case / "mpijob.yaml", "--crd", crd)
    assert good.exit_code == 0 and "valid MPIJob" in good.stdout, good.stderr
    job = yaml.safe_load((GOLDEN / case / "mpijob.yaml").read_text())
    job["spec"]["slotPerWorker"] = 8                                   # a typo a 1.20 server would drop
    job["spec"]["mpiReplicaSpecs"]["Launcher"]["replicas"] = 2
    containers(job, "Launcher")[0]["securityContext"]["privileged"] = True
    broken = tmp_path / "broken.yaml"
    broken.write_text(yaml.safe_dump(job))
    for extra in ([], ["--crd", str(crd)]):
        proc = invoke("validate", broken, *extra)
        assert proc.exit_code == 2
        for path in ("spec.slotPerWorker", "spec.mpiReplicaSpecs.Launcher.replicas",
                     "spec.mpiReplicaSpecs.Launcher.template.spec.containers[0].securityContext.privileged"):
            assert f"  {path}:" in proc.stderr, proc.stderr
        assert "hvdk8s policy: privileged containers are refused" in " ".join(proc.stderr.split())


def test_cache_warm_command_prints_the_daemonset_or_says_why_not():
    proc = cli("cache", "warm", GOLDEN / "s3-cached" / "job.yaml")
    assert proc.returncode == 0, proc.stderr
    ds = yaml.safe_load(proc.stdout)
    assert ds["kind"] == "DaemonSet" and ds == renderer.warm_daemonset(load_job(GOLDEN / "s3-cached" / "job.yaml"))
    proc = cli("cache", "warm", GOLDEN / "cpu" / "job.yaml")
    assert proc.returncode == 2 and "nothing to warm" in proc.stderr and "Traceback" not in proc.stderr


# --- no job file that validates renders an MPIJob hvdk8s's own validation refuses -----------------

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_texts = st.one_of(st.text(max_size=12), st.sampled_from(
    ["a", "eth0", "net1", "/ckpt", "/data/x", "Exists", "NoExecute", "a/b", "ns/net@ib0", "x" * 70, "-a", "a.b"]))
_values = st.recursive(st.none() | st.booleans() | st.integers(-3, 2**32) | _texts,
                       lambda inner: st.lists(inner, max_size=2) | st.dictionaries(_texts, inner, max_size=2),
                       max_leaves=6)
_cluster_fields = st.sampled_from([
    "image", "kubernetes.namespace", "kubernetes.queue", "kubernetes.service_account", "kubernetes.env",
    "kubernetes.secret_env", "kubernetes.node_selector", "kubernetes.image_pull_secrets", "kubernetes.cache_dir",
    "kubernetes.volumes", "kubernetes.tolerations", "kubernetes.launcher", "kubernetes.priority_class",
    "kubernetes.scheduler_name", "kubernetes.scheduling_policy", "kubernetes.run_launcher_as_worker",
    "kubernetes.pod_security", "kubernetes.worker_wait_seconds", "kubernetes.backoff_limit",
    "resources.gpu_product", "resources.rdma", "resources.rdma.networks", "resources.rdma.socket_ifname",
    "resources.rdma.resource", "resources.rdma.count", "resources.workers", "resources.gpus",
    "resources.hierarchical_allreduce", "training.checkpoint.dir", "dataset"])


@settings(max_examples=120, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(case=st.sampled_from(["gpu-4x8-rdma", "nfs-cached", "cpu"]), field=_cluster_fields, value=_values)
def test_a_job_that_validates_renders_or_is_refused_naming_a_field(case, field, value):
    text = yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()
    try:
        spec = load_job(GOLDEN / case / "job.yaml", [f"{field}={text}"])
    except JobFileError as e:
        assert e.problems and all(isinstance(p, str) for p, _ in e.problems)
        return
    try:
        job = renderer.mpijob(spec)
    except ClusterJobError as e:
        assert e.problems and all(p for p, _ in e.problems)
        return
    assert mv.validate_mpijob(job) == [], (field, text)


# --- observability: scraping the ranks' metrics, the PodMonitor, the run directory --------------------

SCRAPE = {"prometheus.io/scrape": "true", "prometheus.io/port": "9400", "prometheus.io/path": "/metrics"}


def rank_template(job) -> dict:
    """The pod template whose pods run the ranks: the workers', or the launcher's when it is the worker."""
    replicas = job["spec"]["mpiReplicaSpecs"]
    return replicas["Launcher" if job["spec"].get("runLauncherAsWorker") else "Worker"]["template"]


@pytest.mark.parametrize("case", CASES)
def test_pods_that_run_ranks_declare_the_metrics_port_and_the_scrape_annotations(case):
    job = job_of(case)
    template = rank_template(job)
    assert {"name": "metrics", "containerPort": 9400, "protocol": "TCP"} in template["spec"]["containers"][0]["ports"]
    assert SCRAPE.items() <= template["metadata"]["annotations"].items()
    launcher = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]
    if launcher is not template and not job["spec"].get("runLauncherAsWorker"):  # mpirun only: nothing to scrape
        assert "ports" not in launcher["spec"]["containers"][0] and "annotations" not in launcher["metadata"]


def test_the_metrics_port_is_the_job_files_and_metrics_off_render_no_port_or_annotation():
    job = job_of("gpu-4x8-rdma", "observability.metrics.port=9500")
    assert rank_template(job)["metadata"]["annotations"]["prometheus.io/port"] == "9500"
    assert {"name": "metrics", "containerPort": 9500, "protocol": "TCP"} in containers(job, "Worker")[0]["ports"]
    for case in ("gpu-4x8-rdma", "single-node"):
        off = rendered(case, "observability.metrics.enabled=false")
        assert "prometheus.io" not in renderer.to_yaml(list(off.values()))
        assert all(p["name"] != "metrics" for c in rank_template(off["mpijob"])["spec"]["containers"]
                   for p in c.get("ports") or [])
        assert yaml.safe_load(off["configmap"]["data"]["job.yaml"])["observability"]["metrics"]["enabled"] is False
    # The RDMA network annotation stays beside (or without) the scrape annotations.
    rdma_off_metrics = rank_template(job_of("gpu-4x8-rdma", "observability.metrics.enabled=false"))
    assert rdma_off_metrics["metadata"]["annotations"] == {"k8s.v1.cni.cncf.io/networks": "rdma-net"}


@pytest.mark.parametrize("case", ["gpu-4x8-tcp", "single-node"])
def test_a_pod_monitor_selects_exactly_the_pods_that_run_ranks(case):
    objects = renderer.render(load_job(GOLDEN / case / "job.yaml", [
        "observability.metrics={pod_monitor: true, scrape_interval_seconds: 30}"]))
    assert [o["kind"] for o in objects] == ["ConfigMap", "MPIJob", "PodMonitor"]
    job, monitor = objects[1], objects[2]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["name"] == job["metadata"]["name"]
    assert monitor["metadata"]["namespace"] == job["metadata"]["namespace"]
    selector = monitor["spec"]["selector"]
    assert list(selector) == ["matchLabels"]
    templates = [r["template"] for r in job["spec"]["mpiReplicaSpecs"].values()]
    selected = [t for t in templates if selector["matchLabels"].items() <= t["metadata"]["labels"].items()]
    assert selected == [rank_template(job)]  # a plain launcher runs mpirun only, and is left out
    assert monitor["spec"]["podMetricsEndpoints"] == [{"port": "metrics", "path": "/metrics", "interval": "30s"}]


def test_render_writes_the_pod_monitor_beside_the_job_and_lists_it_for_kustomize(tmp_path):
    args = ["render", GOLDEN / "gpu-4x8-tcp" / "job.yaml", "--set", "observability.metrics.pod_monitor=true"]
    assert cli(*args, "-d", tmp_path / "a").returncode == 0 and cli(*args, "-d", tmp_path / "b").returncode == 0
    files = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert files == ["configmap.yaml", "kustomization.yaml", "mpijob.yaml", "podmonitor.yaml"]
    assert all((tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes() for f in files)
    kustomization = yaml.safe_load((tmp_path / "a" / "kustomization.yaml").read_text())
    assert kustomization["resources"] == ["configmap.yaml", "mpijob.yaml", "podmonitor.yaml"]
    proc = subprocess.run(["kubectl", "kustomize", str(tmp_path / "a")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert sorted(d["kind"] for d in yaml.safe_load_all(proc.stdout)) == ["ConfigMap", "MPIJob", "PodMonitor"]


def test_a_pod_monitor_of_metrics_turned_off_is_a_field_error(tmp_path):
    out = tmp_path / "out"
    proc = cli("render", GOLDEN / "cpu" / "job.yaml", "--set",
               "observability.metrics={enabled: false, pod_monitor: true}", "-d", out)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and not out.exists()
    assert "  observability.metrics.pod_monitor:" in proc.stderr


def test_a_run_directory_for_timeline_autotune_or_tensorboard_needs_a_writable_volume():
    problems = cluster_problems("gpu-1x8", "observability={timeline: true, dir: /runs/x}")
    assert list(problems) == ["observability.dir"]
    assert "timeline would be lost with the pod" in problems["observability.dir"]
    problems = cluster_problems("gpu-1x8", "observability={tensorboard: true, dir: runs}")
    assert "is relative" in problems["observability.dir"]
    problems = cluster_problems("gpu-1x8", "observability={autotune: true, dir: /data/runs}",
                                "kubernetes.volumes=[{name: ckpt, mount_path: /ckpt, pvc: c}, "
                                "{name: d, mount_path: /data, pvc: d, read_only: true}]")
    assert list(problems) == ["observability.dir"] and "read-only" in problems["observability.dir"]
    # The run directory is the checkpoint directory's unless set: then that field is the one named.
    assert list(cluster_problems("gpu-1x8", "observability.timeline=true", "kubernetes.volumes=[]")) == [
        "training.checkpoint.dir"]
    renderer.render(load_job(GOLDEN / "gpu-1x8" / "job.yaml", ["observability={timeline: true, dir: /ckpt/runs}"]))


def test_the_ranks_get_horovods_timeline_and_autotune_variables_forwarded():
    job = job_of("gpu-1x8", "observability={timeline: true, autotune: true, dir: /ckpt/runs}")
    launcher = containers(job, "Launcher")[0]
    env = env_of(launcher)
    assert env["HOROVOD_TIMELINE"] == "/ckpt/runs/horovod-timeline.json"
    assert env["HOROVOD_AUTOTUNE"] == "1" and env["HOROVOD_AUTOTUNE_LOG"] == "/ckpt/runs/horovod-autotune.csv"
    cmd = mpirun(launcher["command"])
    assert {"HOROVOD_TIMELINE", "HOROVOD_AUTOTUNE", "HOROVOD_AUTOTUNE_LOG"} <= {cmd[i + 1] for i, a in enumerate(cmd)
                                                                                if a == "-x"}
    assert "HOROVOD_TIMELINE" not in env_of(containers(job_of("gpu-1x8"), "Launcher")[0])
    problems = cluster_problems("gpu-1x8", "observability.timeline=true", "kubernetes.env={HOROVOD_TIMELINE: /x}")
    assert "kubernetes.env.HOROVOD_TIMELINE" in problems
