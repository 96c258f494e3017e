#!/usr/bin/env bash
# Build the current test cluster's binaries once per machine, from the Go module proxy by module path
# and version (issue 28): kube-apiserver, kube-controller-manager and kube-scheduler (k8s.io/kubernetes),
# etcd (go.etcd.io/etcd/server/v3), the real MPI operator (github.com/kubeflow/mpi-operator,
# cmd/mpi-operator, the v2beta1 controller), kwok (sigs.k8s.io/kwok, fake nodes) and Kueue
# (sigs.k8s.io/kueue, cmd/kueue). The MPIJob CRD, kwok's stages and Kueue's CRDs and webhook manifests are
# copied from the downloaded modules into crd/, kwok/ and kueue/. Nothing fetched is kept in the repository: the
# go.mod files this script needs are written into the cache folder.
#
# The old 1.20.2 stack (scripts/k8s/build.sh, start.sh) is untouched; this one sits beside it until the
# tests switch (start it with scripts/k8s/start-135.sh). Measurements: docs/k8s-stack.md.
#
# k8s.io/kubernetes cannot be required as is: its go.mod requires every k8s.io/* staging module at
# v0.0.0 and replaces it with ./staging/src/... . The go.mod written here requires k8s.io/kubernetes
# and replaces each of those modules by its published release (v0.<minor>.<patch>); the list is read
# from the downloaded k8s.io/kubernetes go.mod, so a version bump cannot miss one. etcd's server module
# replaces its sibling modules with ../ paths in the same way, and is mapped the same way.
#
# Idempotent: each binary is checked by its --version output; only a missing or different one is built.
# Concurrent runs wait on a lock. Compiles run under `nice -n 19` (HVDK8S_NICE) with CGO off.
#
# Environment: HVDK8S_BUILD_CACHE (default ~/.cache/hvdk8s); HVDK8S_K8S135_DIR (default
# $CACHE/k8s-<versions>); HVDK8S_K8S_KEEP_BUILD=1 keeps the Go module and build caches ($CACHE/gomod,
# $CACHE/go-build, several GB) for a faster rebuild; HVDK8S_NICE (default 19).
# Prints the binaries' folder on its last line.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

K8S_VERSION=1.35.8          # newest 1.35 the proxy serves here (1.35.9-1.35.11: 403, see docs/k8s-stack.md)
ETCD_VERSION=3.6.16         # newest 3.6 served (3.6.17+: 403)
MPI_OPERATOR_VERSION=0.8.2  # v0.8.1, v0.8.3+: 403
KWOK_VERSION=0.8.0
KUEUE_VERSION=0.17.1        # v0.17.2, v0.17.3: 403
GO_MIN=1.26                 # mpi-operator v0.8.2 and etcd 3.6.16 say `go 1.26.0`

CACHE=${HVDK8S_BUILD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hvdk8s}
OUT=${HVDK8S_K8S135_DIR:-$CACHE/k8s-$K8S_VERSION-etcd-$ETCD_VERSION-mpi-operator-$MPI_OPERATOR_VERSION-kwok-$KWOK_VERSION-kueue-$KUEUE_VERSION}
BIN=$OUT/bin
SRC=$OUT/src
NICE=${HVDK8S_NICE:-19}

say() { printf '\033[1m[k8s-build]\033[0m %s\n' "$*" >&2; }
die() { printf '\033[1;31m[k8s-build] error:\033[0m %s\n' "$*" >&2; exit 1; }

K8S_COMPONENTS=(kube-apiserver kube-controller-manager kube-scheduler)
# Each binary's --version, as it must read once built with the ldflags below. (Read whole first: with
# `--version | grep -q` under pipefail, grep's early exit can SIGPIPE a binary that prints more lines.)
has() {
  local v
  [ -x "$BIN/$1" ] || return 1
  if [ "$1" = kueue ]; then  # no --version flag: the module version recorded in the binary
    v=$(go version -m "$BIN/kueue" 2>/dev/null) || return 1
    grep -qE "^[[:space:]]+mod[[:space:]]+sigs\.k8s\.io/kueue[[:space:]]+v$KUEUE_VERSION([[:space:]]|$)" <<<"$v"
    return
  fi
  v=$("$BIN/$1" --version 2>/dev/null) || return 1
  case $1 in
    kube-*) grep -qx "Kubernetes v$K8S_VERSION" <<<"$v" ;;
    etcd) grep -qx "etcd Version: $ETCD_VERSION" <<<"$v" ;;
    mpi-operator) grep -qx "Version: v$MPI_OPERATOR_VERSION" <<<"$v" ;;
    kwok) grep -q "^kwok version v$KWOK_VERSION " <<<"$v" ;;
  esac
}
built() {
  for c in "${K8S_COMPONENTS[@]}" etcd mpi-operator kwok kueue; do has "$c" || return 1; done
  [ -s "$OUT/crd/kubeflow.org_mpijobs.yaml" ] && [ -s "$OUT/kwok/stages.yaml" ] &&
    [ -s "$OUT/kueue/config/components/webhook/manifests.yaml" ]
}

mkdir -p "$CACHE"
exec 9>"$CACHE/k8s-135-build.lock"
flock 9
if built; then
  say "up to date: $BIN (Kubernetes v$K8S_VERSION, etcd $ETCD_VERSION, mpi-operator v$MPI_OPERATOR_VERSION, kwok v$KWOK_VERSION, Kueue v$KUEUE_VERSION)"
  echo "$BIN"
  exit 0
fi

# shellcheck source=go-build-lib.sh
source "$HERE/go-build-lib.sh"
command -v flock >/dev/null || die "flock is needed"
mkdir -p "$BIN" "$SRC" "$OUT/crd"

# One module cache and build cache for every piece (they share most of k8s.io/*). `go build -mod=mod` lets it
# complete the generated go.mod/go.sum from the proxy (checked against sum.golang.org).
go_build_env "$CACHE/gomod" "$CACHE/go-build"
build_date=$(date -u +%FT%TZ)
say "building into $OUT with $(go version) (the first build takes long on 2 cores; once per machine)"

# --- Kubernetes control plane ----------------------------------------------------------------------
need_k8s=()
for c in "${K8S_COMPONENTS[@]}"; do has "$c" || need_k8s+=("$c"); done
if [ ${#need_k8s[@]} -gt 0 ]; then
  kdir=$(download "k8s.io/kubernetes@v$K8S_VERSION")
  [ -f "$kdir/go.mod" ] || die "k8s.io/kubernetes@v$K8S_VERSION was not downloaded"
  staging="v0.${K8S_VERSION#1.}"  # k8s.io/api etc. are published as v0.35.8 for Kubernetes 1.35.8
  replaces=$(sed -n 's|^[[:space:]]*\(k8s\.io/[^ ]*\) => \./staging/src/\1[[:space:]]*$|\t\1 => \1 '"$staging"'|p' "$kdir/go.mod")
  n=$(grep -c '=> ./staging/' "$kdir/go.mod" || true)
  [ "$(printf '%s\n' "$replaces" | grep -c .)" = "$n" ] && [ "$n" -gt 20 ] ||
    die "could not map the $n staging replaces of k8s.io/kubernetes@v$K8S_VERSION's go.mod"
  # The main module's go and godebug lines decide the runtime's defaults: the same as upstream's.
  golines=$(grep -E '^(go|godebug) ' "$kdir/go.mod")
  rm -rf "$SRC/k8s" && mkdir -p "$SRC/k8s"
  printf 'module hvdk8s.local/k8s-build\n\n%s\n\nrequire k8s.io/kubernetes v%s\n\nreplace (\n%s\n)\n' \
    "$golines" "$K8S_VERSION" "$replaces" >"$SRC/k8s/go.mod"
  ld="-s -w"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld+=" -X $pkg.gitVersion=v$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$(echo "$K8S_VERSION" | cut -d. -f2)"
    ld+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$build_date"
  done
  pkgs=()
  for c in "${need_k8s[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$c"); done
  # One `go build` for all three: they share most packages, and go builds them once.
  (cd "$SRC/k8s" && timed kubernetes gobuild -ldflags "$ld" -o "$BIN/" "${pkgs[@]}")
  for c in "${need_k8s[@]}"; do has "$c" || die "the built $c does not report Kubernetes v$K8S_VERSION"; done
fi

# --- etcd --------------------------------------------------------------------------------------------
# go.etcd.io/etcd/server/v3's root package is etcd's main (main.go calls etcdmain.Main); its go.mod
# replaces api/v3, client/pkg/v3, client/v3 and pkg/v3 with ../ paths: mapped to the same release.
if ! has etcd; then
  edir=$(download "go.etcd.io/etcd/server/v3@v$ETCD_VERSION")
  [ -f "$edir/main.go" ] || die "go.etcd.io/etcd/server/v3@v$ETCD_VERSION has no main package at its root"
  replaces=$(sed -n 's|^[[:space:]]*\(go\.etcd\.io/[^ ]*\) => \.\./[^ ]*[[:space:]]*$|\t\1 => \1 v'"$ETCD_VERSION"'|p' "$edir/go.mod")
  [ -n "$replaces" ] || die "found no ../ replaces in go.etcd.io/etcd/server/v3@v$ETCD_VERSION's go.mod"
  rm -rf "$SRC/etcd" && mkdir -p "$SRC/etcd"
  printf 'module hvdk8s.local/etcd-build\n\n%s\n\nrequire go.etcd.io/etcd/server/v3 v%s\n\nreplace (\n%s\n)\n' \
    "$(grep -E '^go ' "$edir/go.mod")" "$ETCD_VERSION" "$replaces" >"$SRC/etcd/go.mod"
  (cd "$SRC/etcd" && timed etcd gobuild \
    -ldflags "-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=module-v$ETCD_VERSION" \
    -o "$BIN/etcd" go.etcd.io/etcd/server/v3)
  has etcd || die "the built etcd does not report $ETCD_VERSION"
fi

# --- the MPI operator and kwok: modules without replace directives --------------------------------------
# Built like `go install module/cmd/x@version` (the module's own go.mod decides every dependency), but
# through a go.mod of our own that requires the module alone: `go install ...@version` reads the module's
# version list to check for deprecation, and the proxy refuses mpi-operator's list (403) here.
build_module() {  # name, module, version, package, ldflags
  local name=$1 mod=$2 ver=$3 pkg=$4 ld=$5 dir
  dir=$(download "$mod@$ver")
  [ -f "$dir/go.mod" ] || die "$mod@$ver was not downloaded"
  ! grep -qE '^replace|=>' "$dir/go.mod" || die "$mod@$ver's go.mod has replace directives: not buildable as is"
  rm -rf "${SRC:?}/$name" && mkdir -p "$SRC/$name"
  printf 'module hvdk8s.local/%s-build\n\n%s\n\nrequire %s %s\n' "$name" "$(grep -E '^go ' "$dir/go.mod")" \
    "$mod" "$ver" >"$SRC/$name/go.mod"
  (cd "$SRC/$name" && timed "$name" gobuild -ldflags "$ld" -o "$BIN/$name" "$pkg")
  has "$name" || die "the built $name does not report $ver"
}
if ! has mpi-operator; then
  build_module mpi-operator github.com/kubeflow/mpi-operator "v$MPI_OPERATOR_VERSION" \
    github.com/kubeflow/mpi-operator/cmd/mpi-operator "-s -w \
    -X github.com/kubeflow/mpi-operator/pkg/version.Version=v$MPI_OPERATOR_VERSION \
    -X github.com/kubeflow/mpi-operator/pkg/version.GitSHA=module-v$MPI_OPERATOR_VERSION \
    -X github.com/kubeflow/mpi-operator/pkg/version.Built=$build_date"
fi
if [ ! -s "$OUT/crd/kubeflow.org_mpijobs.yaml" ]; then
  mdir=$(download "github.com/kubeflow/mpi-operator@v$MPI_OPERATOR_VERSION")
  install -m 0644 "$mdir/manifests/base/kubeflow.org_mpijobs.yaml" "$OUT/crd/kubeflow.org_mpijobs.yaml"
fi
if ! has kwok; then
  build_module kwok sigs.k8s.io/kwok "v$KWOK_VERSION" sigs.k8s.io/kwok/cmd/kwok \
    "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=v$KWOK_VERSION"
fi
# kwok has no stages built in: its module's own node (fast: Ready at once) and pod (general: Running, Ready,
# Job-owned pods Succeeded a second later, deleted pods gone) stages, one file for `kwok --config`.
if [ ! -s "$OUT/kwok/stages.yaml" ]; then
  kdir=$(download "sigs.k8s.io/kwok@v$KWOK_VERSION")
  mkdir -p "$OUT/kwok"
  for f in "$kdir"/kustomize/stage/node/fast/node-*.yaml "$kdir"/kustomize/stage/pod/general/pod-*.yaml; do
    printf -- '---\n'; cat "$f"
  done >"$OUT/kwok/stages.yaml.tmp"
  grep -q 'name: pod-ready' "$OUT/kwok/stages.yaml.tmp" || die "no pod stages in sigs.k8s.io/kwok@v$KWOK_VERSION"
  mv "$OUT/kwok/stages.yaml.tmp" "$OUT/kwok/stages.yaml"
fi

if ! has kueue; then
  build_module kueue sigs.k8s.io/kueue "v$KUEUE_VERSION" sigs.k8s.io/kueue/cmd/kueue \
    "-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=v$KUEUE_VERSION -X sigs.k8s.io/kueue/pkg/version.GitCommit=module-v$KUEUE_VERSION"
fi
# Kueue's CRDs (with the kustomization that says which get a conversion webhook) and webhook manifests,
# rewritten per cluster by kueue-manifests-135.py.
if [ ! -s "$OUT/kueue/config/components/webhook/manifests.yaml" ]; then
  qdir=$(download "sigs.k8s.io/kueue@v$KUEUE_VERSION")
  rm -rf "$OUT/kueue/config" && mkdir -p "$OUT/kueue/config/components"
  cp -r "$qdir/config/components/crd" "$qdir/config/components/webhook" "$OUT/kueue/config/components/"
  chmod -R u+w "$OUT/kueue"
fi

cat >"$OUT/VERSIONS" <<EOF
kubernetes v$K8S_VERSION (k8s.io/kubernetes, staging modules v0.${K8S_VERSION#1.})
etcd v$ETCD_VERSION (go.etcd.io/etcd/server/v3)
mpi-operator v$MPI_OPERATOR_VERSION (github.com/kubeflow/mpi-operator/cmd/mpi-operator)
kwok v$KWOK_VERSION (sigs.k8s.io/kwok/cmd/kwok)
go $(go env GOVERSION)
EOF
if [ "${HVDK8S_K8S_KEEP_BUILD:-0}" != 1 ]; then
  say "removing the Go module and build caches (HVDK8S_K8S_KEEP_BUILD=1 keeps them)"
  chmod -R u+w "$CACHE/gomod" "$CACHE/go-build" "$SRC" 2>/dev/null || true  # Go's caches hold read-only files
  rm -rf "$CACHE/gomod" "$CACHE/go-build" "$SRC"
fi
say "ready in ${SECONDS}s: $BIN ($(du -sh "$BIN" | cut -f1))"
echo "$BIN"
