#!/usr/bin/env bash
# Build the whole test cluster once per machine (docs/k8s-stack.md), each part cached outside the clone
# under ${HVDK8S_BUILD_CACHE:-~/.cache/hvdk8s} and rebuilt only when missing or of another version:
#   debian-packages.sh   the Debian packages the build and bring-up use
#   build-135.sh         Kubernetes 1.35 control plane, etcd, mpi-operator, Kueue, kwok
#   build-node.sh        the real node: kubelet, containerd, runc, CNI plugins, CoreDNS
#   build-node-image.sh  the node's images (pause, and Debian with sshd and OpenMPI for the MPIJob's pods)
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
bash "$HERE/debian-packages.sh"
bash "$HERE/build-135.sh" >/dev/null
bash "$HERE/build-node.sh" >/dev/null
bash "$HERE/build-node-image.sh" --prepare >/dev/null  # the node image itself needs the venv (see there)
