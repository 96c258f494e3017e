#!/usr/bin/env bash
# Build the real node's binaries once per machine (issue 28, item 4), from the Go module proxy by module path
# and version, the same way as build-135.sh: kubelet (k8s.io/kubernetes cmd/kubelet), containerd, its runc
# shim and ctr (github.com/containerd/containerd/v2; ctr imports the images, see build-node-image.sh), runc
# with seccomp (github.com/opencontainers/runc, cgo against Debian's libseccomp-dev), the CNI plugins bridge,
# host-local, loopback and portmap (github.com/containernetworking/plugins) and a small CoreDNS
# (github.com/coredns/coredns: a main of our own with the plugins the node needs). Nothing fetched is kept in
# the repository: every go.mod (and CoreDNS's main.go) is written into the cache folder; no replace points to
# a local path.
#
# No kube-proxy: the only Service IP the pods need is the cluster DNS address, and node.sh gives that address
# to CoreDNS itself inside the node's network namespace (see node.sh). The job's pods talk to each other by
# the headless Service's DNS names (pod IPs), never through a ClusterIP.
#
# Idempotent: each binary is checked by its version output; only a missing or different one is built.
# Concurrent runs wait on a lock. Compiles run under `nice -n 19` (HVDK8S_NICE); CGO off except for runc.
#
# Environment: HVDK8S_BUILD_CACHE (default ~/.cache/hvdk8s); HVDK8S_NODE_DIR (default
# $CACHE/node-<versions>); HVDK8S_K8S_KEEP_BUILD=1 keeps the Go module and build caches ($CACHE/node-gomod,
# $CACHE/node-go-build) for a faster rebuild; HVDK8S_NICE (default 19).
# Needs: go >= 1.26, gcc, pkg-config and libseccomp-dev (apt-get install libseccomp-dev), flock.
# Prints the node folder on its last line (bin/ and cni/bin/ in it). With --check: builds nothing, and exits 3
# (saying what is missing) unless everything is built.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

K8S_VERSION=1.35.8          # the control plane's version (build-135.sh)
CONTAINERD_VERSION=2.4.2    # newest 2.x the proxy serves here
RUNC_VERSION=1.5.3          # newest release (1.6.0-rc.1 is a release candidate)
CNI_VERSION=1.10.0          # newest
COREDNS_VERSION=1.15.0      # newest
GO_MIN=1.26                 # containerd 2.4.2 says go 1.26.6, the CNI plugins 1.26.8

CACHE=${HVDK8S_BUILD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hvdk8s}
OUT=${HVDK8S_NODE_DIR:-$CACHE/node-k8s-$K8S_VERSION-containerd-$CONTAINERD_VERSION-runc-$RUNC_VERSION-cni-$CNI_VERSION-coredns-$COREDNS_VERSION}
BIN=$OUT/bin
CNI_BIN=$OUT/cni/bin
SRC=$OUT/src
NICE=${HVDK8S_NICE:-19}
CNI_PLUGINS=(main/bridge main/loopback ipam/host-local meta/portmap)

say() { printf '\033[1m[node-build]\033[0m %s\n' "$*" >&2; }
die() { printf '\033[1;31m[node-build] error:\033[0m %s\n' "$*" >&2; exit 1; }

# Each binary's version output, as it must read once built with the ldflags below (read whole first: see
# build-135.sh on grep -q and SIGPIPE).
has() {
  local v
  case $1 in
    kubelet)
      [ -x "$BIN/kubelet" ] && v=$("$BIN/kubelet" --version 2>/dev/null) && grep -qx "Kubernetes v$K8S_VERSION" <<<"$v" ;;
    containerd)
      [ -x "$BIN/containerd" ] && v=$("$BIN/containerd" --version 2>/dev/null) &&
        grep -q "^containerd github.com/containerd/containerd/v2 v$CONTAINERD_VERSION " <<<"$v" ;;
    ctr)
      [ -x "$BIN/ctr" ] && v=$("$BIN/ctr" --version 2>/dev/null) && grep -qx "ctr github.com/containerd/containerd/v2 v$CONTAINERD_VERSION" <<<"$v" ;;
    containerd-shim-runc-v2)
      [ -x "$BIN/$1" ] && v=$("$BIN/$1" -v 2>/dev/null) && grep -q "Version:  *v$CONTAINERD_VERSION$" <<<"$v" ;;
    runc)  # and it must have seccomp compiled in (the pods ask for RuntimeDefault)
      [ -x "$BIN/runc" ] && v=$("$BIN/runc" --version 2>/dev/null) && grep -qx "runc version $RUNC_VERSION" <<<"$v" &&
        grep -q '^libseccomp: 2\.' <<<"$v" ;;
    coredns)
      [ -x "$BIN/coredns" ] && v=$("$BIN/coredns" -version 2>/dev/null) && grep -qx "CoreDNS-$COREDNS_VERSION" <<<"$v" ;;
    cni/*)  # a CNI plugin run without CNI_COMMAND prints its "about" line
      [ -x "$CNI_BIN/${1#cni/}" ] && v=$("$CNI_BIN/${1#cni/}" 2>&1 </dev/null || true) &&
        grep -q "plugin v$CNI_VERSION" <<<"$v" ;;
  esac
}
ALL=(kubelet containerd containerd-shim-runc-v2 ctr runc coredns)
for p in "${CNI_PLUGINS[@]}"; do ALL+=("cni/${p#*/}"); done
built() { for c in "${ALL[@]}"; do has "$c" || return 1; done; }

if [ "${1:-}" = --check ]; then
  for c in "${ALL[@]}"; do has "$c" || { echo "$c is not built in $OUT" >&2; exit 3; }; done
  echo "$OUT"
  exit 0
fi
mkdir -p "$CACHE"
exec 9>"$CACHE/node-build.lock"
flock 9
if built; then
  say "up to date: $OUT (kubelet v$K8S_VERSION, containerd v$CONTAINERD_VERSION, runc $RUNC_VERSION, CNI plugins v$CNI_VERSION, CoreDNS $COREDNS_VERSION)"
  echo "$OUT"
  exit 0
fi

# shellcheck source=go-build-lib.sh
source "$HERE/go-build-lib.sh"
command -v gcc >/dev/null && pkg-config --exists libseccomp 2>/dev/null ||
  die "runc needs gcc, pkg-config and libseccomp-dev (apt-get install gcc pkg-config libseccomp-dev)"
mkdir -p "$BIN" "$CNI_BIN" "$SRC"

# Separate caches from build-135.sh's, so that neither script deletes the other's while it builds.
go_build_env "$CACHE/node-gomod" "$CACHE/node-go-build"
# A go.mod of our own that requires one module at one version and nothing else: the module's own go.mod
# decides every dependency (as `go install m@v` would; the proxy refuses some version lists, see
# docs/k8s-stack.md). Refuses a module whose go.mod replaces anything.
own_gomod() {  # name, module, version
  local dir
  dir=$(download "$2@$3")
  [ -f "$dir/go.mod" ] || die "$2@$3 was not downloaded"
  ! grep -qE '^replace|=>' "$dir/go.mod" || die "$2@$3's go.mod has replace directives: not buildable as is"
  rm -rf "${SRC:?}/$1" && mkdir -p "$SRC/$1"
  printf 'module hvdk8s.local/%s-build\n\n%s\n\nrequire %s %s\n' "$1" "$(grep -E '^go ' "$dir/go.mod")" "$2" "$3" \
    >"$SRC/$1/go.mod"
}
build_date=$(date -u +%FT%TZ)
say "building into $OUT with $(go version) (once per machine)"

# --- runc: cgo, for seccomp ---------------------------------------------------------------------------
if ! has runc; then
  own_gomod runc github.com/opencontainers/runc "v$RUNC_VERSION"
  (cd "$SRC/runc" && CGO_ENABLED=1 timed runc gobuild -tags seccomp \
    -ldflags "-s -w -X main.gitCommit=module-v$RUNC_VERSION" -o "$BIN/runc" github.com/opencontainers/runc)
  has runc || die "the built runc does not report $RUNC_VERSION with libseccomp"
fi

# --- CNI plugins ---------------------------------------------------------------------------------------
need=()
for p in "${CNI_PLUGINS[@]}"; do has "cni/${p#*/}" || need+=("github.com/containernetworking/plugins/plugins/$p"); done
if [ ${#need[@]} -gt 0 ]; then
  own_gomod cni github.com/containernetworking/plugins "v$CNI_VERSION"
  (cd "$SRC/cni" && timed cni-plugins gobuild \
    -ldflags "-s -w -X github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion=v$CNI_VERSION" \
    -o "$CNI_BIN/" "${need[@]}")
  for p in "${CNI_PLUGINS[@]}"; do has "cni/${p#*/}" || die "the built CNI plugin ${p#*/} does not report v$CNI_VERSION"; done
fi

# --- CoreDNS, small: only the plugins node.sh's Corefile uses -------------------------------------------
# Upstream's main imports core/plugin (every plugin: cloud DNS clients, etcd, ...). Ours imports the few we
# use and trims dnsserver.Directives (which orders the plugins) to them; coremain.Run is upstream's main.
if ! has coredns; then
  own_gomod coredns github.com/coredns/coredns "v$COREDNS_VERSION"
  cat >"$SRC/coredns/main.go" <<'EOF'
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
)

var keep = map[string]bool{"bind": true, "cache": true, "errors": true, "health": true, "kubernetes": true,
	"log": true, "loop": true, "ready": true, "reload": true}

func init() {
	d := dnsserver.Directives[:0:0]
	for _, n := range dnsserver.Directives {
		if keep[n] {
			d = append(d, n)
		}
	}
	dnsserver.Directives = d
}

func main() { coremain.Run() }
EOF
  (cd "$SRC/coredns" && timed coredns gobuild \
    -ldflags "-s -w -X github.com/coredns/coredns/coremain.GitCommit=module-v$COREDNS_VERSION" -o "$BIN/coredns" .)
  has coredns || die "the built coredns does not report $COREDNS_VERSION"
fi

# --- containerd, its runc shim and ctr: no cgo (btrfs needs it; devmapper and zfs snapshotters left out too) ---
need=()
for c in containerd containerd-shim-runc-v2 ctr; do has "$c" || need+=("github.com/containerd/containerd/v2/cmd/$c"); done
if [ ${#need[@]} -gt 0 ]; then
  own_gomod containerd github.com/containerd/containerd/v2 "v$CONTAINERD_VERSION"
  (cd "$SRC/containerd" && timed containerd gobuild -tags "no_btrfs no_devmapper no_zfs" -ldflags "-s -w \
    -X github.com/containerd/containerd/v2/version.Version=v$CONTAINERD_VERSION \
    -X github.com/containerd/containerd/v2/version.Revision=module-v$CONTAINERD_VERSION" -o "$BIN/" "${need[@]}")
  for c in containerd containerd-shim-runc-v2 ctr; do has "$c" || die "the built $c does not report v$CONTAINERD_VERSION"; done
fi

# --- kubelet: k8s.io/kubernetes through the staging replaces, as build-135.sh does ----------------------
if ! has kubelet; then
  kdir=$(download "k8s.io/kubernetes@v$K8S_VERSION")
  [ -f "$kdir/go.mod" ] || die "k8s.io/kubernetes@v$K8S_VERSION was not downloaded"
  staging="v0.${K8S_VERSION#1.}"
  replaces=$(sed -n 's|^[[:space:]]*\(k8s\.io/[^ ]*\) => \./staging/src/\1[[:space:]]*$|\t\1 => \1 '"$staging"'|p' "$kdir/go.mod")
  n=$(grep -c '=> ./staging/' "$kdir/go.mod" || true)
  [ "$(printf '%s\n' "$replaces" | grep -c .)" = "$n" ] && [ "$n" -gt 20 ] ||
    die "could not map the $n staging replaces of k8s.io/kubernetes@v$K8S_VERSION's go.mod"
  rm -rf "$SRC/kubelet" && mkdir -p "$SRC/kubelet"
  printf 'module hvdk8s.local/k8s-node-build\n\n%s\n\nrequire k8s.io/kubernetes v%s\n\nreplace (\n%s\n)\n' \
    "$(grep -E '^(go|godebug) ' "$kdir/go.mod")" "$K8S_VERSION" "$replaces" >"$SRC/kubelet/go.mod"
  ld="-s -w"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld+=" -X $pkg.gitVersion=v$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$(echo "$K8S_VERSION" | cut -d. -f2)"
    ld+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$build_date"
  done
  (cd "$SRC/kubelet" && timed kubelet gobuild -ldflags "$ld" -o "$BIN/kubelet" k8s.io/kubernetes/cmd/kubelet)
  has kubelet || die "the built kubelet does not report Kubernetes v$K8S_VERSION"
fi

cat >"$OUT/VERSIONS" <<EOF
kubelet v$K8S_VERSION (k8s.io/kubernetes/cmd/kubelet, staging modules v0.${K8S_VERSION#1.})
containerd v$CONTAINERD_VERSION (github.com/containerd/containerd/v2/cmd/{containerd,containerd-shim-runc-v2,ctr}, tags no_btrfs no_devmapper no_zfs)
runc $RUNC_VERSION (github.com/opencontainers/runc, cgo, tag seccomp, libseccomp $(pkg-config --modversion libseccomp))
CNI plugins v$CNI_VERSION (github.com/containernetworking/plugins: ${CNI_PLUGINS[*]})
CoreDNS $COREDNS_VERSION (github.com/coredns/coredns, plugins bind cache errors health kubernetes log loop ready reload)
go $(go env GOVERSION)
EOF
if [ "${HVDK8S_K8S_KEEP_BUILD:-0}" != 1 ]; then
  say "removing the Go module and build caches (HVDK8S_K8S_KEEP_BUILD=1 keeps them)"
  chmod -R u+w "$CACHE/node-gomod" "$CACHE/node-go-build" "$SRC" 2>/dev/null || true
  rm -rf "$CACHE/node-gomod" "$CACHE/node-go-build" "$SRC"
fi
say "ready in ${SECONDS}s: $OUT ($(du -sh "$OUT" | cut -f1))"
echo "$OUT"
