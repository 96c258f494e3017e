"""Cluster settings that cannot surprise (issue 25, item 5): resources per worker pod and per job said in
every message and in `validate --print`, /dev/shm within the pod's memory, a job smaller than a node, the
Pod Security level a job needs said at render and launch, what the dataset-cache sync gets for S3, the
default image of a CPU job, and a script job without a `training` block. (The namespace's Pod Security
label at launch: tests/test_cluster_pod_security.py, against a real API server.)"""
from __future__ import annotations

import http.client
import http.server
import os
import subprocess
import sys
import threading
import urllib.parse
from pathlib import Path

import pytest
import yaml

from conftest import invoke
from hvdk8s import __version__
from hvdk8s.mpijob import podsecurity
from hvdk8s.mpijob import render as renderer
from hvdk8s.spec import dump_job, load_job

S3_DATASET = {"name": None, "path": "s3://datasets/digits-shards", "s3": {"credentials_secret": "minio-creds"}}


def rendered_job(path, *overrides: str) -> dict:
    return renderer.mpijob(load_job(path, list(overrides)))


def worker_pod(job: dict) -> dict:
    return job["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]


# --- per worker pod, per job ----------------------------------------------------------------------

def test_validate_print_says_gpus_are_the_jobs_and_cpu_memory_shm_each_worker_pods(job_file):
    path = job_file({"resources": {"gpus": 16, "gpus_per_node": 8, "cpu": "32", "memory": "200Gi"},
                     "kubernetes": {"namespace": "ml"}})
    printed = invoke("validate", path, "--print")
    assert printed.exit_code == 0, printed.stderr
    lines = {line.strip().split(":")[0]: line for line in printed.stdout.splitlines()}
    assert lines["gpus"].endswith("# the whole job's: 2 worker pods of 8 GPUs each")
    for field in ("cpu", "memory", "shm_size"):
        assert "# each worker pod's, not the job's total (this job: 2 worker pods)" in lines[field], lines[field]
    assert "memory-backed, it counts against memory" in lines["shm_size"]
    # comments only: the printed job is the canonical job file
    assert yaml.safe_load(printed.stdout) == yaml.safe_load(dump_job(load_job(path)))
    # a CPU job says how its ranks are laid out
    cpu = invoke("validate", job_file({"resources": {"workers": 3, "ranks_per_worker": 2}}, "cpu.yaml"), "--print")
    assert "# the whole job's (0: a CPU job; 3 worker pods of 2 ranks each)" in cpu.stdout


def test_the_job_files_descriptions_say_per_worker_pod_and_per_job():
    from hvdk8s.spec import ResourcesSpec

    described = {name: f.description for name, f in ResourcesSpec.model_fields.items()}
    assert "whole job" in described["gpus"]
    for field in ("cpu", "memory", "shm_size"):
        assert "each worker pod" in described[field], described[field]


def test_shm_size_larger_than_memory_is_refused_naming_both_fields(job_file):
    path = job_file()
    refused = invoke("validate", path, "--set", "resources.memory=4Gi", "--set", "resources.shm_size=8Gi")
    assert refused.exit_code == 2
    assert "resources.shm_size (8Gi) is more than resources.memory (4Gi), both per worker pod" in refused.stderr
    assert "memory-backed" in refused.stderr
    # at the limit it is accepted; by default it is half the memory, at most 8Gi
    assert invoke("validate", path, "--set", "resources.memory=4Gi", "--set", "resources.shm_size=4Gi").exit_code == 0
    for memory, shm in (("4Gi", "2Gi"), ("3G", "1500M"), ("64Gi", "8Gi"), ("16Gi", "8Gi"), ("1Gi", "512Mi")):
        spec = load_job(path, [f"resources.memory={memory}"])
        volume = next(v for v in worker_pod(renderer.mpijob(spec))["volumes"] if v["name"] == "dshm")
        assert spec.resources.shm_size == volume["emptyDir"]["sizeLimit"], (memory, spec.resources.shm_size)
        from hvdk8s.core.quantity import parse_quantity
        assert parse_quantity(spec.resources.shm_size) == parse_quantity(shm), (memory, spec.resources.shm_size)


def test_a_job_with_fewer_gpus_than_a_node_gets_one_worker_sized_for_it(job_file):
    job = rendered_job(job_file({"resources": {"gpus": 2, "gpus_per_node": 8}}))
    assert job["spec"]["slotsPerWorker"] == 2
    assert job["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] == 1
    worker = worker_pod(job)["containers"][0]
    assert worker["resources"]["limits"]["nvidia.com/gpu"] == "2" == worker["resources"]["requests"]["nvidia.com/gpu"]
    launcher = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]["command"]
    assert launcher[launcher.index("mpirun") + 2] == "2"  # -np 2
    # more than a node must fill whole nodes, and says so
    refused = invoke("validate", job_file({"resources": {"gpus": 12, "gpus_per_node": 8}}, "12.yaml"))
    assert refused.exit_code == 2 and "gpus (12) do not fill whole nodes of gpus_per_node (8)" in refused.stderr


# --- the Pod Security level a job needs, at render and launch ------------------------------------------

def test_a_job_needing_privileged_says_so_on_stderr_at_render_and_launch(job_file, tmp_path):
    path = job_file({"dataset": S3_DATASET, "kubernetes": {"namespace": "ml"}})
    for run in (invoke("render", path), invoke("render", path, "-d", tmp_path / "out"),
                invoke("launch", path, "--dry-run")):
        assert run.exit_code == 0, run.stderr
        assert run.stderr.startswith("note: job 'digits-mlp' needs the privileged Pod Security level"), run.stderr
        assert "dataset.path: the node-local dataset cache is a hostPath volume" in run.stderr
        assert "pod-security.kubernetes.io/enforce=baseline or restricted rejects its pods" in run.stderr
    nfs = job_file({"kubernetes": {"namespace": "ml", "volumes": [
        {"name": "data", "mount_path": "/data", "nfs": {"server": "nfs.example.com", "path": "/exports/d"}}]}},
        "nfs.yaml")
    assert "needs the baseline Pod Security level" in invoke("render", nfs).stderr
    assert "=restricted rejects its pods" in invoke("render", nfs).stderr
    # a restricted job says nothing
    plain = invoke("render", job_file({"kubernetes": {"namespace": "ml"}}, "plain.yaml"))
    assert plain.exit_code == 0 and plain.stderr == ""


# --- what the dataset-cache sync gets for S3 -----------------------------------------------------------

def test_the_sync_init_container_gets_region_proxies_ca_bundle_and_credentials(job_file):
    dataset = {"name": None, "path": "s3://datasets/digits-shards", "s3": {
        "endpoint_url": "https://s3.internal.example.com", "credentials_secret": "minio-creds",
        "region": "eu-west-1", "ca_bundle": {"secret": "internal-ca", "key": "ca.pem"}}}
    kubernetes = {"namespace": "ml", "env": {"HTTPS_PROXY": "http://proxy.example.com:3128",
                                              "NO_PROXY": ".svc,.cluster.local"},
                  "secret_env": {"HTTP_PROXY": {"secret": "proxy", "key": "url"}}}
    path = job_file({"dataset": dataset, "kubernetes": kubernetes})
    pod = worker_pod(rendered_job(path))
    sync = next(c for c in pod["initContainers"] if c["name"] == "dataset-cache")
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in sync["env"]}
    assert env["AWS_ENDPOINT_URL"] == "https://s3.internal.example.com"
    assert env["AWS_REGION"] == env["AWS_DEFAULT_REGION"] == "eu-west-1"
    assert env["HTTPS_PROXY"] == "http://proxy.example.com:3128" and env["NO_PROXY"] == ".svc,.cluster.local"
    assert env["HTTP_PROXY"] == {"secretKeyRef": {"name": "proxy", "key": "url"}}
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        assert env[key] == {"secretKeyRef": {"name": "minio-creds", "key": key}}
    assert env["AWS_SESSION_TOKEN"] == {"secretKeyRef": {"name": "minio-creds", "key": "AWS_SESSION_TOKEN",
                                                         "optional": True}}
    mount = next(m for m in sync["volumeMounts"] if m["name"] == "s3-ca-bundle")
    assert mount["readOnly"] and env["AWS_CA_BUNDLE"] == f"{mount['mountPath']}/ca.pem"
    assert {"name": "s3-ca-bundle", "secret": {"secretName": "internal-ca"}} in pod["volumes"]
    # a ConfigMap works as well, and the warm-up DaemonSet's sync gets the same
    spec = load_job(path, ["dataset.s3.ca_bundle={config_map: internal-ca}"])
    warm = renderer.warm_daemonset(spec)["spec"]["template"]["spec"]
    assert {"name": "s3-ca-bundle", "configMap": {"name": "internal-ca"}} in warm["volumes"]
    warm_env = {e["name"]: e.get("value") for e in warm["initContainers"][1]["env"]}
    assert warm_env["AWS_CA_BUNDLE"].endswith("/ca.crt") and warm_env["HTTPS_PROXY"]
    # the CA volume is a Secret or ConfigMap: no more than the cache's own Pod Security level
    assert podsecurity.job_level(spec) == "privileged"
    assert not [v for v in podsecurity.violations({"spec": warm}) if "s3-ca-bundle" in v.message]


class _RecordingProxy(http.server.BaseHTTPRequestHandler):
    """A forward HTTP proxy (absolute-URI requests, as clients send them through HTTP_PROXY) that records them."""

    def _forward(self) -> None:
        self.server.seen.append((self.command, self.path))
        url = urllib.parse.urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("proxy-connection", "connection")}
        upstream = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
        upstream.request(self.command, url.path + (f"?{url.query}" if url.query else ""),
                         body=self.rfile.read(length) if length else None, headers=headers)
        answer = upstream.getresponse()
        body = answer.read()
        self.send_response(answer.status)
        for key, value in answer.getheaders():
            if key.lower() not in ("transfer-encoding", "connection") and (key.lower() != "content-length"
                                                                           or self.command == "HEAD"):
                self.send_header(key, value)
        if self.command != "HEAD":
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
        upstream.close()

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _forward

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def recording_proxy():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _RecordingProxy)
    server.seen = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def _container_env(container: dict, secrets: dict[str, dict[str, str]]) -> dict[str, str]:
    """A container's environment as the kubelet sets it: values, and Secret keys looked up in SECRETS."""
    env = {}
    for e in container.get("env", []):
        if "value" in e:
            env[e["name"]] = e["value"]
        else:
            ref = e["valueFrom"]["secretKeyRef"]
            if ref["key"] in secrets.get(ref["name"], {}):
                env[e["name"]] = secrets[ref["name"]][ref["key"]]
            else:
                assert ref.get("optional"), f"{e['name']}: no key {ref['key']} in Secret {ref['name']}"
    return env


DATASET_FILES = {"train/part-0.bin": b"x" * 1000, "test/part-0.bin": b"y" * 10}


def _s3_dataset(s3_endpoint: str, tmp_path: Path) -> dict:
    """DATASET_FILES in a bucket of moto's S3 server in eu-west-1; the job's `dataset` for it."""
    import boto3

    client = boto3.client("s3", endpoint_url=s3_endpoint, aws_access_key_id="testing",
                          aws_secret_access_key="testing", region_name="eu-west-1")
    client.create_bucket(Bucket="datasets", CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
    for rel, data in DATASET_FILES.items():
        client.put_object(Bucket="datasets", Key=f"digits/{rel}", Body=data)
    return {"name": None, "path": "s3://datasets/digits", "s3": {
        "endpoint_url": s3_endpoint, "credentials_secret": "s3-creds", "region": "eu-west-1"}}


@pytest.fixture
def http_dataset(tmp_path):
    """DATASET_FILES published (with their manifest) by an HTTP server on loopback; the job's `dataset` for it."""
    import functools

    from hvdk8s.data import cache as dc

    root = tmp_path / "www" / "digits"
    for rel, data in DATASET_FILES.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    dc.write_manifest(root)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(
        type("Quiet", (http.server.SimpleHTTPRequestHandler,), {"log_message": lambda *a: None}),
        directory=str(tmp_path / "www")))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield {"name": None, "path": f"http://127.0.0.1:{server.server_address[1]}/digits/"}
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("source", ["s3", "http"])
def test_the_sync_init_container_reaches_its_source_through_the_jobs_proxy(job_file, tmp_path, recording_proxy,
                                                                           source, request):
    """The init container's command and environment, run here as the kubelet would run them: the sync reaches
    S3 with the Secret's credentials, in the job's region (or an HTTP server), through the job's proxy."""
    dataset = (_s3_dataset(request.getfixturevalue("s3_endpoint"), tmp_path) if source == "s3"
               else request.getfixturevalue("http_dataset"))
    proxy = f"http://127.0.0.1:{recording_proxy.server_address[1]}"
    path = job_file({"dataset": dataset, "kubernetes": {"namespace": "ml",
                                                        "env": {"HTTP_PROXY": proxy, "NO_PROXY": ".svc"}}})
    sync = next(c for c in worker_pod(rendered_job(path))["initContainers"] if c["name"] == "dataset-cache")
    secrets = {"s3-creds": {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}}
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "AWS_EC2_METADATA_DISABLED": "true",
           **_container_env(sync, secrets)}
    cache_dir = load_job(path).kubernetes.cache_dir
    command = [str(tmp_path / "cache") if a == cache_dir else a for a in sync["command"]]
    assert command[:3] == ["hvdk8s", "cache", "sync"]
    run = subprocess.run([sys.executable, "-m", "hvdk8s", *command[1:]], capture_output=True, text=True, env=env,
                         timeout=300)
    assert run.returncode == 0, run.stderr
    synced = Path(run.stdout.strip().splitlines()[-1])
    assert {str(p.relative_to(synced)): p.read_bytes() for p in synced.rglob("*") if p.is_file()} == DATASET_FILES
    host = (dataset["s3"]["endpoint_url"] + "/datasets" if source == "s3" else dataset["path"])
    assert any(url.startswith(host) for _, url in recording_proxy.seen), recording_proxy.seen


def _self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 (its own CA) and its key, as PEM files."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "hvdk8s test CA")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = directory / "ca.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


@pytest.fixture
def s3_behind_private_ca(tmp_path):
    """moto's S3 over HTTPS with a certificate of a private CA: (endpoint URL, the CA's PEM file)."""
    import ssl

    from moto.server import DomainDispatcherApplication, create_backend_app
    from werkzeug.serving import make_server

    (tmp_path / "tls").mkdir()
    cert, key = _self_signed(tmp_path / "tls")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server = make_server("127.0.0.1", 0, DomainDispatcherApplication(create_backend_app), threaded=True,
                         ssl_context=context)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"https://127.0.0.1:{server.server_address[1]}", cert
    server.shutdown()


def test_the_sync_init_container_trusts_the_jobs_ca_bundle(job_file, tmp_path, s3_behind_private_ca):
    """The sync container's command and environment, its CA bundle Secret mounted where the pod mounts it:
    the sync reaches an S3 endpoint whose certificate a private CA signed; without the bundle it cannot."""
    import boto3

    endpoint, ca = s3_behind_private_ca
    client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="testing", aws_secret_access_key="testing",
                          region_name="us-east-1", verify=str(ca))
    client.create_bucket(Bucket="private")
    for rel, data in DATASET_FILES.items():
        client.put_object(Bucket="private", Key=f"digits/{rel}", Body=data)
    path = job_file({"dataset": {"name": None, "path": "s3://private/digits", "s3": {
        "endpoint_url": endpoint, "credentials_secret": "s3-creds", "ca_bundle": {"secret": "internal-ca"}}},
        "kubernetes": {"namespace": "ml"}})
    sync = next(c for c in worker_pod(rendered_job(path))["initContainers"] if c["name"] == "dataset-cache")
    mounted = {m["mountPath"]: tmp_path / m["name"] for m in sync["volumeMounts"]}  # each volume, here
    ca_mount = next(m["mountPath"] for m in sync["volumeMounts"] if m["name"] == "s3-ca-bundle")
    mounted[ca_mount].mkdir()
    (mounted[ca_mount] / "ca.crt").write_bytes(ca.read_bytes())  # the Secret's key ca.crt, as the kubelet writes it

    def here(value: str) -> str:
        for inside, local in mounted.items():
            if value == inside or value.startswith(inside + "/"):
                return str(local) + value[len(inside):]
        return value

    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "AWS_EC2_METADATA_DISABLED": "true",
           **{k: here(v) for k, v in _container_env(sync, {"s3-creds": {"AWS_ACCESS_KEY_ID": "testing",
                                                                         "AWS_SECRET_ACCESS_KEY": "testing"}}).items()}}
    command = [sys.executable, "-m", "hvdk8s", *map(here, sync["command"][1:])]
    run = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr
    synced = Path(run.stdout.strip().splitlines()[-1])
    assert {str(p.relative_to(synced)): p.read_bytes() for p in synced.rglob("*") if p.is_file()} == DATASET_FILES
    untrusted = subprocess.run(command + ["--key", "again"], capture_output=True, text=True, timeout=300,
                               env={k: v for k, v in env.items() if k != "AWS_CA_BUNDLE"})
    assert untrusted.returncode != 0 and "CERTIFICATE_VERIFY_FAILED" in untrusted.stderr.replace(" ", "_").upper(), \
        untrusted.stderr


def test_the_credentials_secrets_key_names_are_documented():
    from hvdk8s.spec import S3Spec

    described = S3Spec.model_fields["credentials_secret"].description
    assert "AWS_ACCESS_KEY_ID" in described and "AWS_SECRET_ACCESS_KEY" in described
    assert "kubectl create secret generic" in described


@pytest.mark.parametrize("bad, message", [
    ({"ca_bundle": {"key": "ca.crt"}}, "give exactly one of `secret` or `config_map`"),
    ({"ca_bundle": {"secret": "a", "config_map": "b"}}, "give exactly one of `secret` or `config_map`"),
    ({"region": "EU West"}, "is not a region name"),
])
def test_bad_s3_settings_are_refused_naming_the_field(job_file, bad, message):
    path = job_file({"dataset": {**S3_DATASET, "s3": {**S3_DATASET["s3"], **bad}}})
    refused = invoke("validate", path, "--no-import")
    assert refused.exit_code == 2 and message in refused.stderr and "dataset.s3." in refused.stderr


# --- the default image ---------------------------------------------------------------------------------

def test_a_cpu_job_without_image_gets_the_cpu_image_and_print_says_how_to_build_it(job_file):
    cpu = load_job(job_file())
    assert cpu.image == f"ghcr.io/hvdk8s/hvdk8s-cpu:{__version__}"
    worker = worker_pod(renderer.mpijob(cpu))["containers"][0]
    assert worker["image"] == cpu.image
    printed = invoke("validate", job_file(), "--print").stdout
    image_line = next(line for line in printed.splitlines() if line.startswith("image:"))
    assert image_line == (f"image: ghcr.io/hvdk8s/hvdk8s-cpu:{__version__}  # hvdk8s's default for a CPU job; "
                          f"built with: docker build -f Dockerfile.gpu --build-arg DEVICE=cpu -t "
                          f"ghcr.io/hvdk8s/hvdk8s-cpu:{__version__} .")
    gpu = load_job(job_file({"resources": {"gpus": 8}}, "gpu.yaml"))
    assert gpu.image == f"ghcr.io/hvdk8s/hvdk8s-gpu:{__version__}"
    # an image of one's own is kept, and not commented on
    own = job_file({"image": "registry.example.com/ml/own:1"}, "own.yaml")
    assert load_job(own).image == "registry.example.com/ml/own:1"
    assert "# " not in next(line for line in invoke("validate", own, "--print").stdout.splitlines()
                            if line.startswith("image:"))


# --- a script job needs no training block ------------------------------------------------------------

def test_a_script_job_needs_no_training_block(tmp_path):
    (tmp_path / "train.py").write_text("import hvdk8s\nprint(hvdk8s.job().name)\n")
    (tmp_path / "job.yaml").write_text("name: own\nframework: pytorch\nentrypoint: {script: train.py}\n")
    validated = invoke("validate", tmp_path / "job.yaml")
    assert validated.exit_code == 0 and validated.stdout.strip() == \
        f"{tmp_path / 'job.yaml'}: valid (pytorch script train.py)", validated.stderr
    assert invoke("render", tmp_path / "job.yaml").exit_code == 0
    # training fields it gives are still checked (its script reads them through hvdk8s.job())
    bad = invoke("validate", tmp_path / "job.yaml", "--set", "training.epochs=0")
    assert bad.exit_code == 2 and "training.epochs" in bad.stderr
    # hvdk8s's own trainer still needs them, each named
    (tmp_path / "trainer.yaml").write_text("name: t\nframework: pytorch\nmodel: {name: mlp}\n"
                                           "dataset: {name: digits}\n")
    refused = invoke("validate", tmp_path / "trainer.yaml")
    assert refused.exit_code == 2
    for field in ("training.epochs", "training.batch_size", "training.learning_rate"):
        assert f"{field}: required field is missing (hvdk8s's trainer reads it" in refused.stderr
