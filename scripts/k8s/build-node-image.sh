#!/usr/bin/env bash
# Build the images the real node runs (issue 28, item 4), without a container engine or a registry, and
# print where their OCI archives are (node.sh imports them into containerd's k8s.io namespace):
#
#   hvdk8s.local/pause:<stamp>  the pod sandbox image: a static pause (reap children, sleep) compiled here.
#   hvdk8s.local/node:<stamp>   what Dockerfile.gpu's CPU target gives an MPIJob's pods, from Debian bookworm
#                               (debootstrap, cached): mpiuser uid/gid 1000, sshd with
#                               /home/mpiuser/.sshd_config on port 2222 and the ssh client config, OpenMPI
#                               (Debian's 4.1.4, the one the host's Horovod is built against).
#
# Python: the image does not carry the project's venv (6.9 GB here: torch's CUDA build and its nvidia-*
# libraries, TensorFlow; a copy would be tarred, imported and unpacked for every image build). The ranks get
# the host's venv read-only by hostPath (`kubernetes.volumes`, see docs/k8s-stack.md "The real node"), at
# /opt/hvdk8s-host, with the pyenv Python its bin/python links to at that same path (hvdk8s refuses a mount
# that would hide the image's /opt/hvdk8s). hvdk8s gives `kubernetes.volumes` to the launcher only where a
# volume says `launcher: true` (an elastic job's horovodrun needs Horovod), so a plain job's launcher
# (which runs `python -m hvdk8s.launch.workers` and mpirun, nothing else) has no such mount: it uses the
# image's own /opt/hvdk8s-image, a venv of Debian's python3 with a copy of hvdk8s's sources.
# The same holds for a cached dataset's init containers (they mount the cache and the dataset's source only,
# mpijob/cache.py), which run `hvdk8s cache sync`: so that venv also gets the CLI's and the HTTP(S) sync's
# dependencies (pydantic, PyYAML, click, rich, fsspec, aiohttp and what they require; not s3fs/botocore, so
# not S3 sources), copied file by file from the host's venv (HVDK8S_VENV, default ROOT/.venv: cp311 wheels,
# which Debian's Python 3.11 runs), as Dockerfile.gpu's image has hvdk8s installed with its dependencies.
# /opt/hvdk8s/bin (Dockerfile.gpu's path, first on PATH, also in
# sshd's SetEnv) holds `python`, `python3`, `hvdk8s` and `horovodrun`, which run the mounted venv where it
# is mounted and the image's otherwise (horovodrun: only the mounted one has Horovod). The image's /root is
# 0711 so that uid 1000 can reach the pyenv mount.
#
# Environment: HVDK8S_BUILD_CACHE (default ~/.cache/hvdk8s); HVDK8S_DEBIAN_MIRROR (default
# http://deb.debian.org/debian); HVDK8S_VENV (default ROOT/.venv). Needs root, debootstrap, gcc with static
# glibc (libc6-dev), tar, python3.
# Prints two lines: the pause archive, then the node image archive; each archive's image name is in
# <archive>.name. `--prepare` (scripts/k8s/build.sh, which CI runs before scripts/setup.sh has made the venv):
# without the venv, build only what needs none (the pause image and the Debian base: the slow, networked
# part) and exit 0; the node image (seconds) is then built by node.sh's first start.
set -euo pipefail

SUITE=bookworm
PACKAGES=openssh-server,openssh-client,openmpi-bin,python3
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
CACHE=${HVDK8S_BUILD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hvdk8s}
MIRROR=${HVDK8S_DEBIAN_MIRROR:-http://deb.debian.org/debian}
NICE=${HVDK8S_NICE:-19}

say() { printf '\033[1m[node-image]\033[0m %s\n' "$*" >&2; }
die() { printf '\033[1;31m[node-image] error:\033[0m %s\n' "$*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "needs root (debootstrap, chroot)"

PREPARE=0
case ${1:-} in --prepare) PREPARE=1 ;; "") ;; *) die "usage: build-node-image.sh [--prepare]" ;; esac
mkdir -p "$CACHE"
exec 9>"$CACHE/node-image.lock"
flock 9

# OCI image archive (oci-layout, index.json, blobs) of one uncompressed layer: what `ctr images import` takes.
oci_archive() {  # layer.tar, out.tar, name, config-json-fragment (Entrypoint/Cmd/User/Env/WorkingDir)
  python3 - "$@" <<'EOF'
import hashlib, json, os, sys, tarfile, tempfile, io
layer, out, name, cfg = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
def digest(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
ld = digest(layer)
config = json.dumps({"architecture": "amd64", "os": "linux", "config": cfg,
                     "rootfs": {"type": "layers", "diff_ids": ["sha256:" + ld]}}).encode()
cd = hashlib.sha256(config).hexdigest()
manifest = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
    "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": "sha256:" + cd, "size": len(config)},
    "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": "sha256:" + ld,
                "size": os.path.getsize(layer)}]}).encode()
md = hashlib.sha256(manifest).hexdigest()
index = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
    "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": "sha256:" + md,
                   "size": len(manifest), "platform": {"architecture": "amd64", "os": "linux"},
                   "annotations": {"io.containerd.image.name": name,
                                   "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1]}}]}).encode()
with tarfile.open(out + ".tmp", "w") as t:
    def add(arc, data):
        info = tarfile.TarInfo(arc); info.size = len(data); t.addfile(info, io.BytesIO(data))
    add("oci-layout", b'{"imageLayoutVersion": "1.0.0"}')
    add("index.json", index)
    add("blobs/sha256/" + cd, config)
    add("blobs/sha256/" + md, manifest)
    t.add(layer, "blobs/sha256/" + ld)
os.replace(out + ".tmp", out)
with open(out + ".name", "w") as f:
    f.write(name + "\n")
EOF
}

# --- pause -------------------------------------------------------------------------------------------
# Kubernetes' pause (build/pause/linux/pause.c) is not in the Go module; this one does what the sandbox
# needs: exit on SIGINT/SIGTERM, reap zombies, sleep.
PAUSE_C='#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
static void die(int s) { (void)s; _exit(0); }
static void reap(int s) { (void)s; while (waitpid(-1, NULL, WNOHANG) > 0) {} }
int main(void) {
  struct sigaction a = {0}, r = {0};
  a.sa_handler = die; sigaction(SIGINT, &a, NULL); sigaction(SIGTERM, &a, NULL);
  r.sa_handler = reap; r.sa_flags = SA_NOCLDSTOP; sigaction(SIGCHLD, &r, NULL);
  for (;;) pause();
}'
pstamp=$(printf '%s' "$PAUSE_C" | sha256sum | cut -c1-12)
PDIR=$CACHE/node-image-pause-$pstamp
if [ ! -s "$PDIR/pause.oci.tar" ]; then
  rm -rf "$PDIR" && mkdir -p "$PDIR/rootfs"
  printf '%s\n' "$PAUSE_C" >"$PDIR/pause.c"
  gcc -static -Os -s -o "$PDIR/rootfs/pause" "$PDIR/pause.c" || die "gcc -static failed (libc6-dev?)"
  tar -C "$PDIR/rootfs" --numeric-owner --owner=0 --group=0 -cf "$PDIR/layer.tar" pause
  oci_archive "$PDIR/layer.tar" "$PDIR/pause.oci.tar" "hvdk8s.local/pause:$pstamp" \
    '{"Entrypoint": ["/pause"], "User": "65535:65535"}'
  rm -rf "$PDIR/rootfs" "$PDIR/layer.tar"
fi

# --- Debian base (debootstrap), cached by suite and package list -------------------------------------------
bstamp=$(printf '%s %s' "$SUITE" "$PACKAGES" | sha256sum | cut -c1-12)
BASE=$CACHE/node-image-debian-$SUITE-$bstamp.tar
if [ ! -s "$BASE" ]; then
  command -v debootstrap >/dev/null || die "debootstrap is needed (apt-get install debootstrap)"
  tmp=$(mktemp -d "$CACHE/debootstrap.XXXXXX")
  t0=$SECONDS
  say "debootstrap $SUITE --variant=minbase --include=$PACKAGES (once; log: $tmp.log)"
  nice -n "$NICE" debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$tmp/rootfs" "$MIRROR" \
    >"$tmp.log" 2>&1 || { tail -n 20 "$tmp.log" >&2; die "debootstrap failed"; }
  rm -rf "$tmp/rootfs/var/cache/apt/archives/"*.deb "$tmp/rootfs/var/lib/apt/lists/"*
  tar -C "$tmp/rootfs" --numeric-owner -cf "$BASE.tmp" . && mv "$BASE.tmp" "$BASE"
  rm -rf "$tmp" "$tmp.log"
  say "debian base: $((SECONDS - t0))s, $(du -h "$BASE" | cut -f1)"
fi

# --- the node image: base + what Dockerfile.gpu's CPU target adds ------------------------------------------
# Stamped by this script, the base and hvdk8s's sources (the launcher's copy must match the ranks' venv).
# The sync's dependencies (see the header): the distributions' files as the host's venv has them, relative to
# its site-packages (first line: their names and versions, part of the stamp).
VENV=${HVDK8S_VENV:-$ROOT/.venv}
if [ ! -x "$VENV/bin/python" ]; then
  [ "$PREPARE" = 1 ] && { say "no venv at $VENV yet: the node image is built at the node's first start"; exit 0; }
  die "no venv at $VENV (scripts/setup.sh, or set HVDK8S_VENV)"
fi
SYNC_DEPS=(pydantic PyYAML click rich fsspec aiohttp)
deps_list=$(mktemp) && trap 'rm -f "$deps_list"' EXIT
"$VENV/bin/python" - "${SYNC_DEPS[@]}" >"$deps_list" <<'EOF'
import importlib.metadata as md, re, sys
try:
    from packaging.markers import Marker
except ImportError:
    from pip._vendor.packaging.markers import Marker
todo, seen, files = list(sys.argv[1:]), {}, []
while todo:  # the distributions and what they require (markers evaluated for this Python, no extras)
    name = re.sub(r"[-_.]+", "-", todo.pop()).lower()
    if name in seen:
        continue
    dist = md.distribution(name)
    seen[name] = dist.version
    for req in dist.requires or []:
        spec, _, marker = req.partition(";")
        if not marker or Marker(marker.strip()).evaluate({"extra": ""}):
            todo.append(re.match(r"[A-Za-z0-9_.-]+", spec.strip()).group(0))
    files += [str(f) for f in dist.files or [] if not str(f).startswith("..") and not str(f).endswith(".pyc")]
print(" ".join(f"{n}=={v}" for n, v in sorted(seen.items())))
print("\n".join(sorted(set(files))))
EOF
VENV_SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
# hvdk8s's packages where setup.py installs them, read from its PACKAGE_DIR (the one list): "folder:place",
# the repository folder and its place under site-packages (hvdk8s.bench -> bench:hvdk8s/bench).
mapfile -t HVDK8S_PACKAGES < <("$VENV/bin/python" - "$ROOT/setup.py" <<'EOF'
import ast, sys
tree = ast.parse(open(sys.argv[1], encoding="utf-8").read())
(node,) = [n for n in tree.body if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "PACKAGE_DIR"]
for name, folder in sorted(ast.literal_eval(node.value).items()):
    print(f"{folder}:{name.replace('.', '/')}")
EOF
)
[ "${#HVDK8S_PACKAGES[@]}" -gt 0 ] || die "no PACKAGE_DIR in $ROOT/setup.py"
istamp=$( (cat "$0"; printf '%s' "$bstamp"; head -n1 "$deps_list"
  cd "$ROOT" && for p in "${HVDK8S_PACKAGES[@]}"; do find "${p%%:*}" -name '*.py' -type f; done | LC_ALL=C sort | xargs cat) |
  sha256sum | cut -c1-12)
IDIR=$CACHE/node-image-$istamp
if [ ! -s "$IDIR/node.oci.tar" ]; then
  t0=$SECONDS
  rm -rf "$IDIR" && mkdir -p "$IDIR/rootfs"
  tar -C "$IDIR/rootfs" -xf "$BASE"
  r=$IDIR/rootfs
  chroot "$r" /bin/sh -ec '
    groupadd --gid 1000 mpiuser
    useradd --create-home --uid 1000 --gid 1000 --shell /bin/bash mpiuser
    rm -f /etc/ssh/ssh_host_*
    mkdir -p /run/sshd
    chmod 0711 /root
    python3 -m venv --without-pip /opt/hvdk8s-image
    mkdir -p /opt/hvdk8s/bin /opt/hvdk8s-host'
  # Dockerfile.gpu's sshd and client configuration, word for word (its ENV PATH; no CUDA here).
  printf '%s\n' 'Port 2222' 'HostKey /home/mpiuser/.ssh/id_rsa' 'PidFile /home/mpiuser/sshd.pid' 'StrictModes no' \
    'PubkeyAuthentication yes' 'AuthorizedKeysFile .ssh/authorized_keys' 'PasswordAuthentication no' \
    'KbdInteractiveAuthentication no' 'UsePAM no' \
    'SetEnv PATH=/opt/hvdk8s/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LD_LIBRARY_PATH=' \
    >"$r/home/mpiuser/.sshd_config"
  chroot "$r" chown 1000:1000 /home/mpiuser/.sshd_config
  printf '%s\n' 'Host *' '    Port 2222' '    StrictHostKeyChecking no' '    UserKnownHostsFile /dev/null' \
    '    LogLevel ERROR' >"$r/etc/ssh/ssh_config.d/hvdk8s.conf"
  chroot "$r" /bin/sh -ec 'ssh -G worker-0 | grep -qx "port 2222"
    ssh-keygen -q -t ed25519 -N "" -f /tmp/k
    # (the configured host key comes from the operator'"'"'s Secret at run time: its absence is said only on failure)
    out=$(/usr/sbin/sshd -t -f /home/mpiuser/.sshd_config -o HostKey=/tmp/k 2>&1) || { echo "$out" >&2; exit 1; }
    rm -f /tmp/k /tmp/k.pub'
  # The launcher's and the sync's hvdk8s (see the header): the packages' sources and the sync's dependencies.
  site=$(echo "$r"/opt/hvdk8s-image/lib/python3*/site-packages)
  for p in "${HVDK8S_PACKAGES[@]}"; do
    mkdir -p "$site/${p#*:}"
    (cd "$ROOT/${p%%:*}" && find . -name '*.py' -type f | tar -cf - -T -) | tar -C "$site/${p#*:}" -xf -
  done
  tail -n +2 "$deps_list" | tar -C "$VENV_SITE" -cf - -T - | tar -C "$site" -xf -
  for cmd in python python3; do
    printf '#!/bin/sh\n# the mounted venv where there is one (rank pods), else the image'"'"'s own (the launcher)\n[ -x /opt/hvdk8s-host/bin/python ] && exec /opt/hvdk8s-host/bin/python "$@"\nexec /opt/hvdk8s-image/bin/python "$@"\n' >"$r/opt/hvdk8s/bin/$cmd"
  done
  printf '#!/bin/sh\nexec /opt/hvdk8s/bin/python -m hvdk8s "$@"\n' >"$r/opt/hvdk8s/bin/hvdk8s"
  # An elastic job's launcher runs horovodrun: Horovod's, from the mounted venv (a `launcher: true` volume).
  printf '#!/bin/sh\nexec /opt/hvdk8s/bin/python -c '"'"'import sys; sys.argv[0] = "horovodrun"; from horovod.runner.launch import run_commandline; sys.exit(run_commandline())'"'"' "$@"\n' >"$r/opt/hvdk8s/bin/horovodrun"
  chmod 0755 "$r"/opt/hvdk8s/bin/*
  chroot "$r" /opt/hvdk8s/bin/python -c 'import hvdk8s.launch.workers' || die "hvdk8s.launch.workers does not import in the image"
  chroot "$r" /opt/hvdk8s/bin/hvdk8s cache sync --help >/dev/null || die "hvdk8s cache sync does not run in the image"
  chroot "$r" /opt/hvdk8s/bin/python -c 'import aiohttp, fsspec.implementations.http' ||
    die "the image's Python cannot sync from HTTP(S)"
  tar -C "$r" --numeric-owner -cf "$IDIR/layer.tar" .
  oci_archive "$IDIR/layer.tar" "$IDIR/node.oci.tar" "hvdk8s.local/node:$istamp" \
    '{"Cmd": ["/usr/sbin/sshd", "-De", "-f", "/home/mpiuser/.sshd_config"], "User": "mpiuser", "WorkingDir": "/home/mpiuser", "Env": ["PATH=/opt/hvdk8s/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"], "ExposedPorts": {"2222/tcp": {}}}'
  rm -rf "$IDIR/rootfs" "$IDIR/layer.tar"
  say "node image: $((SECONDS - t0))s, $(du -h "$IDIR/node.oci.tar" | cut -f1)"
fi
# Other stamps (hvdk8s's sources or this script changed): 263 MB each, removed once unused for an hour. Not at
# once: checkouts of other branches on this machine share the cache, and one's build must not delete the
# archive another's node.sh is about to import (this run's is touched: it is in use). A node already running
# keeps its imported copy.
touch "$IDIR"
for old in "$CACHE"/node-image-[0-9a-f]*; do
  [ "$old" != "$IDIR" ] && [ -d "$old" ] && [[ $(basename "$old") =~ ^node-image-[0-9a-f]{12}$ ]] &&
    [ -n "$(find "$old" -maxdepth 0 -mmin +60)" ] && rm -rf "$old"
done
echo "$PDIR/pause.oci.tar"
echo "$IDIR/node.oci.tar"
