#!/usr/bin/env bash
# Add ONE real node that runs containers to a cluster started by scripts/k8s/start-135.sh (issue 28, item 4),
# or remove it:
#
#   scripts/k8s/node.sh STATE_DIR start     # prints the node's name on its last line
#   scripts/k8s/node.sh STATE_DIR stop
#   scripts/k8s/node.sh STATE_DIR relay HOST_PORT   # prints the address pods reach it at (10.88.0.1:HOST_PORT)
#
# The binaries come from scripts/k8s/build-node.sh, the images from scripts/k8s/build-node-image.sh (both
# run first: "up to date" once built). Everything of the node runs in one network namespace and one mount
# namespace that this script creates (a holder process keeps them; STATE_DIR/node/):
#
#   containerd 2 (CRI, overlayfs, runc with seccomp, the cgroupfs driver on this kernel's cgroup v1),
#   kubelet 1.35 (failCgroupV1: false), the CNI bridge (cni0, 10.88.0.0/16, pods' default gateway
#   10.88.0.1) and CoreDNS (kubernetes plugin) on the cluster DNS address 10.96.0.10. The not-ready taint
#   the API server puts on every new Node is lifted by start-135.sh's node-lifecycle-controller.
#
# Pod traffic never leaves the machine: the namespace's only interfaces are lo and the pods' bridge, with no
# route out. The host side only gets two listeners on 127.0.0.1 (socat): the API server's port is relayed
# into the namespace (127.0.0.1:API_PORT there -> STATE_DIR/node/api.sock -> 127.0.0.1:API_PORT here) and the
# kubelet's port out of it (127.0.0.1:KUBELET_PORT here -> STATE_DIR/node/kubelet.sock -> the kubelet on
# 127.0.0.1:KUBELET_PORT there), so `kubectl logs` goes API server -> kubelet with the kubelet's serving
# certificate, which start-135.sh signs with STATE_DIR/certs/ca.crt for 127.0.0.1 (--kubelet-certificate-
# authority). Nothing under the host's /etc, /var or /run is written: every path is in STATE_DIR/node.
#
# `relay HOST_PORT` (on a started node) makes a server that listens on the host's 127.0.0.1:HOST_PORT (a test's
# HTTP or S3 server: a dataset's source) reachable from the node's pods, which have no route out, at
# 10.88.0.1:HOST_PORT: the pods' gateway (cni0) in the node's namespace. There socat listens on that address
# and hands each connection through a unix socket (STATE_DIR/node/relay-HOST_PORT.sock, mode 600) to a socat
# on the host that connects to 127.0.0.1:HOST_PORT. The host gets no new TCP listener at all, and the relay
# reaches only that one port. `stop` ends the relays with the node.
#
# The node's name is 127.0.0.1: the API server reaches kubelets by their InternalIP
# (--kubelet-preferred-address-types InternalIP), the kubelet refuses a loopback --node-ip ("nodeIP can't
# be loopback address"), but takes its InternalIP from --hostname-override when that is an IP
# (pkg/kubelet/nodestatus/setters.go), and the node's name is the hostname.
#
# No kube-proxy: the only ClusterIP a pod here uses is the DNS address, and CoreDNS listens on it itself
# (10.96.0.10 is an address of the namespace's lo; pods reach it through their gateway). The Service
# kube-system/kube-dns holds that ClusterIP in the API, so the address cannot be given to another Service.
# An MPIJob's pods find each other by the headless Service's names, which resolve to pod IPs on the bridge.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
say() { printf '\033[1m[k8s-node]\033[0m %s\n' "$*" >&2; }
die() { printf '\033[1;31m[k8s-node] error:\033[0m %s\n' "$*" >&2; exit 1; }

usage="usage: node.sh STATE_DIR start|stop|relay HOST_PORT"
[ $# -eq 2 ] || { [ $# -eq 3 ] && [ "$2" = relay ]; } || die "$usage"
STATE=$(cd "$1" && pwd) || die "no state folder $1 (start the cluster with start-135.sh first)"
N=$STATE/node
NODE_NAME=127.0.0.1
DNS_IP=10.96.0.10
POD_CIDR=10.88.0.0/16
# The kubelet's cgroup root, one per node (cgroup v1: a folder in every hierarchy), so that two nodes on one
# machine (parallel test runs) never share kubepods, and stop kills exactly this node's pods.
CGROUP_ROOT=hvdk8s-node-$(printf '%s' "$N" | sha256sum | cut -c1-10)

running() { kill -0 "$1" 2>/dev/null && [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" != Z ]; }
alive() { [ -f "$N/$1.pid" ] && running "$(cat "$N/$1.pid")"; }

stop() {
  # Clients first; the holder (and with it the namespaces and their mounts) last. Only the recorded pids,
  # and only if they still run what was started. A node that goes away takes its pods' processes along
  # (the API objects stay, as with a lost node): the processes in the kubelet's cgroups (kubepods, cgroup
  # v1, cgroupfs driver) and the runc shims of this node's containerd (found by its socket's path).
  local entry name binary pid p
  for entry in kubelet:/kubelet pods: shims: coredns:/coredns \
      containerd:/containerd relays: kubelet-relay-in:socat kubelet-relay:socat api-relay-in:socat api-relay:socat \
      holder:sleep; do
    name=${entry%%:*} binary=${entry#*:}
    if [ "$name" = pods ]; then
      for p in $(cat /sys/fs/cgroup/pids/"$CGROUP_ROOT"/cgroup.procs /sys/fs/cgroup/pids/"$CGROUP_ROOT"/*/cgroup.procs \
          /sys/fs/cgroup/pids/"$CGROUP_ROOT"/*/*/cgroup.procs /sys/fs/cgroup/pids/"$CGROUP_ROOT"/*/*/*/cgroup.procs \
          /sys/fs/cgroup/pids/"$CGROUP_ROOT"/*/*/*/*/cgroup.procs 2>/dev/null); do
        kill -KILL "$p" 2>/dev/null || true
      done
      continue
    fi
    if [ "$name" = relays ]; then  # node.sh STATE relay PORT: relay-PORT-in (in the namespace), relay-PORT
      for p in "$N"/relay-*.pid; do
        [ -f "$p" ] || continue
        pid=$(cat "$p")
        running "$pid" && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q -- socat && kill -TERM "$pid" && say "stopped $(basename "$p" .pid) (pid $pid)"
        rm -f "$p"
      done
      continue
    fi
    if [ "$name" = shims ]; then
      for p in /proc/[0-9]*; do
        tr '\0' ' ' 2>/dev/null <"$p/cmdline" | grep -q -- "containerd-shim-runc-v2 .*-address $N/containerd.sock" &&
          kill -KILL "${p#/proc/}" 2>/dev/null || true
      done
      continue
    fi
    [ -f "$N/$name.pid" ] || continue
    pid=$(cat "$N/$name.pid")
    if running "$pid" && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q -- "$binary"; then
      kill -TERM "$pid"
      for _ in $(seq 1 100); do running "$pid" || break; sleep 0.1; done
      running "$pid" && kill -KILL "$pid"
      say "stopped $name (pid $pid)"
    fi
    rm -f "$N/$name.pid"
  done
  # The kubelet's cgroups, empty now; deepest first.
  for h in /sys/fs/cgroup/*/"$CGROUP_ROOT"; do
    [ -d "$h" ] && find "$h" -depth -type d -exec rmdir {} + 2>/dev/null || true
  done
  rm -f "$N"/*.sock
  return 0
}

# The pods' gateway: the node namespace's address on their bridge (cni0), where relays listen.
GATEWAY=10.88.0.1

relay() {  # HOST_PORT: see the top
  local port=$1 holder i
  [[ $port =~ ^[0-9]+$ ]] && [ "$port" -ge 1 ] && [ "$port" -le 65535 ] || die "relay: not a port: $port"
  alive holder && alive kubelet || die "$STATE has no running node (node.sh $STATE start first)"
  alive "relay-$port-in" && die "port $port is relayed already"
  holder=$(cat "$N/holder.pid")
  rm -f "$N/relay-$port.sock"
  setsid socat "UNIX-LISTEN:$N/relay-$port.sock,fork,mode=600" "TCP:127.0.0.1:$port" >"$N/relay-$port.log" 2>&1 </dev/null &
  echo $! >"$N/relay-$port.pid"
  setsid nsenter --target "$holder" --net --mount -- \
    socat "TCP-LISTEN:$port,bind=$GATEWAY,fork,reuseaddr" "UNIX-CONNECT:$N/relay-$port.sock" \
    >"$N/relay-$port-in.log" 2>&1 </dev/null &
  echo $! >"$N/relay-$port-in.pid"
  for i in $(seq 1 200); do  # both ends listening (the connection itself is left to the server's client)
    [ -S "$N/relay-$port.sock" ] &&
      [ -n "$(nsenter --target "$holder" --net -- ss -Hltn "src $GATEWAY:$port" 2>/dev/null)" ] && break
    alive "relay-$port" && alive "relay-$port-in" || die "relay of port $port exited (logs: $N/relay-$port*.log)"
    [ "$i" = 200 ] && die "relay of port $port not listening after 10s"
    sleep 0.05
  done
  say "127.0.0.1:$port here is $GATEWAY:$port for the node's pods"
  echo "$GATEWAY:$port"
}

case $2 in
  stop) stop; exit 0 ;;
  relay) relay "$3"; exit 0 ;;
  start) ;;
  *) die "$usage" ;;
esac

[ -s "$STATE/kubeconfig" ] && [ -s "$STATE/ports" ] || die "$STATE has no cluster (start-135.sh $STATE first)"
# shellcheck disable=SC1091
. "$STATE/ports"
command -v socat >/dev/null || die "socat is needed (apt-get install socat)"
for n in holder containerd kubelet coredns; do alive "$n" && die "$STATE already has a node: node.sh $STATE stop first"; done
# The cluster's controller-manager lifts the node's not-ready taint (a cluster started before start-135.sh
# always ran node-lifecycle-controller would leave the node unschedulable).
tr '\0' ' ' <"/proc/$(cat "$STATE/controller-manager.pid" 2>/dev/null || echo 0)/cmdline" 2>/dev/null |
  grep -q 'node-lifecycle-controller' ||
  die "the cluster's kube-controller-manager runs no node-lifecycle-controller: start it with this checkout's start-135.sh"
NODE_DIR=$(bash "$HERE/build-node.sh" | tail -n1)
# Its paths on stdout (a failed build has said why on stderr; `< <(...)` alone would hide its exit status).
images=$(bash "$HERE/build-node-image.sh") || die "the node image did not build (above)"
mapfile -t IMAGES <<<"$images"
[ "${#IMAGES[@]}" -ge 2 ] || die "build-node-image.sh printed ${#IMAGES[@]} image paths, not 2"
BIN=$NODE_DIR/bin CNI_BIN=$NODE_DIR/cni/bin
PAUSE_IMAGE=$(cat "${IMAGES[0]}.name") NODE_IMAGE=$(cat "${IMAGES[1]}.name")
kc() { kubectl --kubeconfig "$STATE/kubeconfig" "$@"; }
T0=$(date +%s.%N)
lap() { awk -v n="$1" -v a="$(date +%s.%N)" -v b="$T0" 'BEGIN { printf "%s %.2fs\n", n, a - b }' >>"$N/start-times.txt"; }
trap 'code=$?; [ $code -eq 0 ] || stop' EXIT

rm -rf "$N" && mkdir -p "$N"/{cni/net.d,cni/data,kubelet,pod-logs,containerd/root,containerd/state,runc,opt}
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
KUBELET_PORT=$(free_port)
printf 'KUBELET_PORT=%s\nNODE_NAME=%s\nNODE_IMAGE=%s\nPAUSE_IMAGE=%s\n' "$KUBELET_PORT" "$NODE_NAME" "$NODE_IMAGE" \
  "$PAUSE_IMAGE" >"$N/env"

# --- the namespaces: a holder process; everything else joins it with nsenter ------------------------------
setsid unshare --net --mount --propagation private -- sleep infinity </dev/null >/dev/null 2>&1 &
echo $! >"$N/holder.pid"
HOLDER=$!
for _ in $(seq 1 50); do [ "$(readlink /proc/$HOLDER/ns/net)" != "$(readlink /proc/self/ns/net)" ] && break; sleep 0.05; done
inns() { nsenter --target "$HOLDER" --net --mount -- "$@"; }
inns ip link set lo up
inns ip addr add "$DNS_IP/32" dev lo
# The bridge now, not at the first pod: CoreDNS's replies to the pods route through it.
inns ip link add cni0 type bridge
inns ip addr add 10.88.0.1/16 dev cni0
inns ip link set cni0 up
bg() {  # name, command...: start in the namespaces, detached, logged, pid recorded
  local name=$1; shift
  setsid nsenter --target "$HOLDER" --net --mount -- "$@" >"$N/$name.log" 2>&1 </dev/null &
  echo $! >"$N/$name.pid"
}
wait_for() {  # what, seconds, command...: poll until the command succeeds (it keeps its stderr quiet)
  local what=$1 secs=$2; shift 2
  for _ in $(seq 1 $((secs * 4))); do "$@" >/dev/null && return 0; sleep 0.25; done
  die "$what not ready after ${secs}s (logs in $N)"
}

# --- relays: the API server into the namespace, the kubelet out of it (unix sockets cross namespaces) ------
setsid socat "UNIX-LISTEN:$N/api.sock,fork,mode=600" "TCP:127.0.0.1:$API_PORT" >"$N/api-relay.log" 2>&1 </dev/null &
echo $! >"$N/api-relay.pid"
bg api-relay-in socat "TCP-LISTEN:$API_PORT,bind=127.0.0.1,fork,reuseaddr" "UNIX-CONNECT:$N/api.sock"
setsid socat "TCP-LISTEN:$KUBELET_PORT,bind=127.0.0.1,fork,reuseaddr" "UNIX-CONNECT:$N/kubelet.sock" \
  >"$N/kubelet-relay.log" 2>&1 </dev/null &
echo $! >"$N/kubelet-relay.pid"
bg kubelet-relay-in socat "UNIX-LISTEN:$N/kubelet.sock,fork,mode=600" "TCP:127.0.0.1:$KUBELET_PORT"

# --- CNI: bridge + host-local, and portmap (hostPort) where iptables is installed --------------------------
# portmap programs iptables (in the namespace's own netfilter tables) and fails every pod's teardown without
# the command; hvdk8s's pods use no hostPort, so it is left out on a machine without iptables.
PORTMAP=""
command -v iptables >/dev/null && PORTMAP=',
    {"type": "portmap", "capabilities": {"portMappings": true}}'
cat >"$N/cni/net.d/10-hvdk8s.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "hvdk8s-node",
  "plugins": [
    {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
     "ipam": {"type": "host-local", "dataDir": "$N/cni/data", "ranges": [[{"subnet": "$POD_CIDR", "gateway": "10.88.0.1"}]],
              "routes": [{"dst": "0.0.0.0/0"}]}}$PORTMAP
  ]
}
EOF

# --- containerd ----------------------------------------------------------------------------------------
cat >"$N/containerd.toml" <<EOF
version = 3
root = "$N/containerd/root"
state = "$N/containerd/state"
[grpc]
  address = "$N/containerd.sock"
[ttrpc]
  address = "$N/containerd.sock.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "$N/opt"
[plugins."io.containerd.nri.v1.nri"]
  disable = true
[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "$PAUSE_IMAGE"
[plugins."io.containerd.cri.v1.runtime"]
  # Root here lacks CAP_SYS_RESOURCE (CapEff 0x1fffeffffff), so no process may lower its oom_score_adj:
  # runc's "failed to update /proc/self/oom_score_adj: Permission denied" for the sandbox's -998. This keeps
  # every container's at or above containerd's own (0).
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  cdi_spec_dirs = []
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = "$BIN/runc"
        Root = "$N/runc"
        SystemdCgroup = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["$CNI_BIN"]
    conf_dir = "$N/cni/net.d"
[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
EOF
say "containerd $("$BIN/containerd" --version | awk '{print $3}') (namespaces of its own: $N)"
bg containerd env PATH="$BIN:$PATH" "$BIN/containerd" --config "$N/containerd.toml"
ctr() { inns "$BIN/ctr" --address "$N/containerd.sock" --namespace k8s.io "$@"; }
ctr_up() { ctr version >/dev/null 2>&1; }
wait_for containerd 60 ctr_up
lap containerd-ready
for a in "${IMAGES[@]}"; do
  ctr images import --platform linux/amd64 "$a" >>"$N/image-import.log" 2>&1 || { cat "$N/image-import.log" >&2; die "importing $a failed"; }
done
# The list first, then grep: `ctr ... | grep -q` under pipefail fails when grep's early exit SIGPIPEs a ctr
# still writing (it did, on a busy machine, with the image there).
imported=$(ctr images ls -q)
grep -qx "$NODE_IMAGE" <<<"$imported" || die "$NODE_IMAGE is not in containerd after the import: $imported"
lap images-imported

# --- the cgroup root: a folder in every cgroup v1 hierarchy (cpuset's needs its parent's cpus and mems) ------
for h in /sys/fs/cgroup/*/; do
  [ -L "${h%/}" ] && continue  # cpu,cpuacct-style links to a joint hierarchy
  mkdir -p "$h$CGROUP_ROOT"
  [ -f "${h}cpuset.cpus" ] && cat "${h}cpuset.cpus" >"$h$CGROUP_ROOT/cpuset.cpus" && cat "${h}cpuset.mems" >"$h$CGROUP_ROOT/cpuset.mems"
done

# --- kubelet --------------------------------------------------------------------------------------------
cat >"$N/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: $KUBELET_PORT
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
tlsCertFile: $STATE/certs/kubelet.crt
tlsPrivateKeyFile: $STATE/certs/kubelet.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: $STATE/certs/ca.crt}
authorization: {mode: AlwaysAllow}   # only the API server's client certificate gets past x509
cgroupDriver: cgroupfs
cgroupRoot: /$CGROUP_ROOT
failCgroupV1: false
failSwapOn: false
oomScoreAdj: 0                       # -999 needs CAP_SYS_RESOURCE (see restrict_oom_score_adj above)
containerRuntimeEndpoint: unix://$N/containerd.sock
podLogsDir: $N/pod-logs
clusterDNS: [$DNS_IP]
clusterDomain: cluster.local
resolvConf: ""
maxPods: 30
serializeImagePulls: false
evictionHard: {memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
nodeStatusReportFrequency: 10s
EOF
say "kubelet $("$BIN/kubelet" --version) on 127.0.0.1:$KUBELET_PORT (in the namespace; relayed here), node $NODE_NAME"
bg kubelet "$BIN/kubelet" --config "$N/kubelet.yaml" --kubeconfig "$STATE/kubeconfig" --root-dir "$N/kubelet" \
  --hostname-override "$NODE_NAME" --v 2

# --- CoreDNS on the cluster DNS address, and the kube-dns Service that holds that address ---------------------
kc apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Service
metadata:
  name: kube-dns
  namespace: kube-system
  labels: {k8s-app: kube-dns}
spec:
  clusterIP: $DNS_IP
  ports:
  - {name: dns, port: 53, protocol: UDP}
  - {name: dns-tcp, port: 53, protocol: TCP}
EOF
# The hostfile's names are <pod>.<job>.<ns>.svc (no cluster domain): a pod's resolv.conf search list ends
# in cluster.local, which completes them.
cat >"$N/Corefile" <<EOF
.:53 {
    bind $DNS_IP
    errors
    health 127.0.0.1:8080
    ready 127.0.0.1:8181
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        kubeconfig $STATE/kubeconfig hvdk8s-test
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }
    cache 5
}
EOF
bg coredns "$BIN/coredns" -conf "$N/Corefile"

# --- ready: the node Ready and untainted, CoreDNS ready -------------------------------------------------------
node_ready() {
  for n in containerd kubelet coredns; do
    alive "$n" || { tail -n 30 "$N/$n.log" >&2; die "$n exited (log: $N/$n.log)"; }
  done
  kc get node "$NODE_NAME" --no-headers \
      -o custom-columns='R:.status.conditions[?(@.type=="Ready")].status,T:.spec.taints' 2>/dev/null |
    grep -q '^True *<none>$'
}
wait_for "the node" 180 node_ready
lap node-ready
wait_for coredns 60 inns curl -sf --max-time 2 http://127.0.0.1:8181/ready
lap coredns-ready
say "node $NODE_NAME ready in $(tail -n1 "$N/start-times.txt" | awk '{print $2}') (image $NODE_IMAGE)"
echo "$NODE_NAME"
