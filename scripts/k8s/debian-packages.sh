#!/usr/bin/env bash
# The Debian packages the test cluster's build and bring-up use (scripts/k8s/*), installed from apt when
# missing, as scripts/setup.sh installs its own: run once per machine before building (.ci/run does).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
need=()
command -v openssl >/dev/null || need+=(openssl)
command -v curl >/dev/null || need+=(curl)
command -v kubectl >/dev/null || need+=(kubernetes-client)
command -v socat >/dev/null || need+=(socat)              # the API server relayed into network namespaces
command -v unshare >/dev/null || need+=(util-linux)
command -v flock >/dev/null || need+=(util-linux)
command -v gcc >/dev/null || need+=(gcc)                  # runc (cgo, seccomp) and the pause image
command -v pkg-config >/dev/null || need+=(pkg-config)
pkg-config --exists libseccomp 2>/dev/null || need+=(libseccomp-dev)
command -v debootstrap >/dev/null || need+=(debootstrap)  # the node's image
command -v iptables >/dev/null || need+=(iptables)        # CNI portmap in the node's namespace
bash "$HERE/../apt-install.sh" k8s-packages "${need[@]}"
