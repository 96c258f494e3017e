#!/usr/bin/env bash
# Start the current test cluster (issue 28) from the binaries scripts/k8s/build-135.sh caches (built first
# if missing), everything on 127.0.0.1:
#   etcd 3.6; kube-apiserver 1.35 (RBAC, privileged containers allowed as kubeadm allows them, the default
#   admission plugins with PodSecurity and ServiceAccount
#   on); kube-controller-manager with the job, garbage-collector, endpointslice, namespace, serviceaccount
#   root-ca-certificate-publisher and node-lifecycle controllers; kube-scheduler; the MPIJob CRD from the operator's
#   module; the real MPI operator (v2beta1 controller) out of cluster with --kubeConfig;
#   with --kueue: Kueue as a process (its webhooks and CRD conversion reached by URL on 127.0.0.1, served
#   with a certificate the test CA signs; integrations batch/job and kubeflow.org/mpijob; the visibility
#   API server, which needs the aggregation layer, off), before the operator;
#   with --kwok-nodes N: kwok and N fake nodes (kwok-node-0..N-1, untainted: the only nodes there are) whose
#   pods it marks Running and Ready (and Job-owned pods Succeeded a second later: kwok's general stages).
#
#   scripts/k8s/start-135.sh STATE_DIR [--kwok-nodes N] [--node-gpus G] [--kwok-stages FILE]
#                            [--kwok-node-port PORT] [--kueue] [--no-operator]
#   scripts/k8s/start-135.sh STATE_DIR --apiserver-only    start the API server again over the running etcd
#   scripts/k8s/stop-135.sh STATE_DIR [--apiserver-only]
#
#   --kwok-stages FILE: kwok's pod and node stages from FILE instead of its module's general ones.
#   --kwok-node-port PORT: the kubelet port kwok's nodes advertise (where the API server proxies
#     `pods/log` to); default: kwok's own server (TLS with the cluster CA's kubelet certificate), whose
#     log follows never end, unlike a kubelet's when the container exits.
#
# The operator always serves its health check on :8080 of every interface (a constant in its
# cmd/mpi-operator/app/server.go; no flag). To keep every listener on loopback it runs in a network
# namespace of its own (unshare --net; only `lo` there) and reaches the API server through a socat relay:
# 127.0.0.1:API_PORT inside -> a unix socket in STATE_DIR -> 127.0.0.1:API_PORT outside. That also
# lets several clusters (parallel test workers) each run an operator without fighting over 8080.
#
# STATE_DIR gets the certificates (a self-signed CA), the token file, the logs, the pids and `kubeconfig`
# (users `admin`, system:masters, the current context, and `nobody`, no RBAC rights), as start.sh does.
# Prints the kubeconfig path on its last line.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
say() { printf '\033[1m[k8s-start]\033[0m %s\n' "$*" >&2; }
die() { printf '\033[1;31m[k8s-start] error:\033[0m %s\n' "$*" >&2; exit 1; }

[ $# -ge 1 ] || die "usage: start-135.sh STATE_DIR [--kwok-nodes N] [--node-gpus G] [--kwok-stages FILE] [--kwok-node-port PORT] [--kueue] [--no-operator] | --apiserver-only"
STATE=$(mkdir -p "$1" && cd "$1" && pwd); shift
KWOK_NODES=0 NODE_GPUS=8 OPERATOR=1 KUEUE=0 KWOK_STAGES="" KWOK_NODE_PORT="" ONLY_APISERVER=0
while [ $# -gt 0 ]; do
  case $1 in
    --kwok-nodes) KWOK_NODES=$2; shift 2 ;;
    --node-gpus) NODE_GPUS=$2; shift 2 ;;
    --kwok-stages) KWOK_STAGES=$(cd "$(dirname "$2")" && pwd)/$(basename "$2"); shift 2 ;;
    --kwok-node-port) KWOK_NODE_PORT=$2; shift 2 ;;
    --apiserver-only) ONLY_APISERVER=1; shift ;;
    --no-operator) OPERATOR=0; shift ;;
    --kueue) KUEUE=1; shift ;;
    *) die "unknown argument $1" ;;
  esac
done
command -v socat >/dev/null || die "socat is needed (apt-get install socat)"
command -v unshare >/dev/null || die "unshare is needed (util-linux)"
BIN=$(bash "$HERE/build-135.sh" | tail -n1)
CRD=$(dirname "$BIN")/crd/kubeflow.org_mpijobs.yaml
started=$SECONDS
T0=$(date +%s.%N)
lap() { awk -v n="$1" -v a="$(date +%s.%N)" -v b="$T0" 'BEGIN { printf "%s %.2fs\n", n, a - b }' >>"$STATE/start-times.txt"; }
alive() { [ -f "$STATE/$1.pid" ] && kill -0 "$(cat "$STATE/$1.pid")" 2>/dev/null; }
wait_apiserver() {  # until /readyz answers ok (the admin token from the token file)
  local token ready=0
  token=$(cut -d, -f1 "$STATE/certs/tokens.csv" | head -n1)
  for _ in $(seq 1 480); do
    alive apiserver || { tail -n 20 "$STATE/apiserver.log" >&2; die "kube-apiserver exited (log: $STATE/apiserver.log)"; }
    alive etcd || { tail -n 20 "$STATE/etcd.log" >&2; die "etcd exited (log: $STATE/etcd.log)"; }
    if [ "$(curl -s --max-time 2 --cacert "$STATE/certs/ca.crt" -H "Authorization: Bearer $token" \
        "https://127.0.0.1:$(sed -n 's/^API_PORT=//p' "$STATE/ports")/readyz" 2>/dev/null)" = ok ]; then ready=1; break; fi
    sleep 0.25
  done
  [ "$ready" = 1 ] || { tail -n 20 "$STATE/apiserver.log" >&2; die "kube-apiserver not ready after 120s"; }
}
start_operator() {  # in a network namespace of its own (see the top), from STATE/mpi-operator.cmd
  setsid unshare --net -- bash "$STATE/mpi-operator.cmd" >>"$STATE/mpi-operator.log" 2>&1 </dev/null &
  echo $! >"$STATE/mpi-operator.pid"
}
start_kueue() {  # in a mount namespace of its own (see where it is first started), until ready
  setsid unshare --mount --propagation private -- bash "$STATE/kueue.cmd" >>"$STATE/kueue.log" 2>&1 </dev/null &
  echo $! >"$STATE/kueue.pid"
  local health ready=0
  health=$(sed -n 's/^KUEUE_HEALTH_PORT=//p' "$STATE/ports")
  for _ in $(seq 1 480); do
    alive kueue || { tail -n 20 "$STATE/kueue.log" >&2; die "kueue exited (log: $STATE/kueue.log)"; }
    [ "$(curl -s --max-time 2 "http://127.0.0.1:$health/readyz" 2>/dev/null)" = ok ] && { ready=1; break; }
    sleep 0.25
  done
  [ "$ready" = 1 ] || { tail -n 20 "$STATE/kueue.log" >&2; die "kueue not ready after 120s"; }
}
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
if [ "$ONLY_APISERVER" = 1 ]; then  # the same command line as the first start (ports, certificates, etcd)
  alive etcd || die "no etcd runs for $STATE: start the whole cluster"
  alive apiserver && die "the API server of $STATE runs already"
  trap 'code=$?; [ $code -eq 0 ] || bash "$HERE/stop-135.sh" "$STATE" --apiserver-only' EXIT
  say "kube-apiserver again"
  setsid bash "$STATE/apiserver.cmd" >>"$STATE/apiserver.log" 2>&1 </dev/null &
  echo $! >"$STATE/apiserver.pid"
  wait_apiserver
  # Kueue as deployed holds a leader lease too and exits when it cannot renew it (its Deployment then
  # starts it again); here it runs without one, and stayed up through the outage with caches that lagged
  # the restarted server by a minute under load (its reflectors back off up to 30 s, jittered): meanwhile
  # its Job webhook refused the operator's launcher ("MPIJob ... not found") and the operator's retries
  # backed off past the tests' 5 minutes. So stop-135.sh --apiserver-only stops it too, as losing its
  # lease would, and it starts again here, before the operator, with caches read from the new server.
  if [ -f "$STATE/kueue.cmd" ] && ! alive kueue; then
    say "kueue again"
    start_kueue
  fi
  # The operator cannot renew its leader lease without the API server and exits (klog.Fatal), so
  # stop-135.sh --apiserver-only stops it too; it starts again here and leads at once: the lease its
  # stopped predecessor held is deleted (else the new one waits for it to expire, 15 s).
  if [ -f "$STATE/mpi-operator.cmd" ] && ! alive mpi-operator; then
    led=$(grep -c "Leading started" "$STATE/mpi-operator.log" || true)
    kubectl --kubeconfig "$STATE/kubeconfig" -n mpi-operator delete lease mpi-operator --ignore-not-found >/dev/null
    say "mpi-operator again"
    start_operator
    for _ in $(seq 1 480); do
      alive mpi-operator || { tail -n 20 "$STATE/mpi-operator.log" >&2; die "mpi-operator exited"; }
      [ "$(grep -c "Leading started" "$STATE/mpi-operator.log" || true)" -gt "$led" ] && { again=1; break; }
      sleep 0.25
    done
    [ "${again:-0}" = 1 ] || die "mpi-operator did not lead again within 120s"
  fi
  echo "$STATE/kubeconfig"
  exit 0
fi
NAMES=(etcd apiserver controller-manager scheduler api-relay mpi-operator kwok kueue)
for n in "${NAMES[@]}"; do alive "$n" && die "$STATE already has a running cluster: stop it first (stop-135.sh $STATE)"; done
trap 'code=$?; [ $code -eq 0 ] || bash "$HERE/stop-135.sh" "$STATE"' EXIT
rm -rf "$STATE/etcd-data" "$STATE/certs" "$STATE/start-times.txt"
ETCD_PORT=$(free_port) ETCD_PEER_PORT=$(free_port) API_PORT=$(free_port) KCM_PORT=$(free_port)
SCHED_PORT=$(free_port) KWOK_PORT=$(free_port) KUEUE_WEBHOOK_PORT=$(free_port) KUEUE_HEALTH_PORT=$(free_port)
printf 'ETCD_PORT=%s\nETCD_PEER_PORT=%s\nAPI_PORT=%s\nKCM_PORT=%s\nSCHED_PORT=%s\nKWOK_PORT=%s\n' "$ETCD_PORT" \
  "$ETCD_PEER_PORT" "$API_PORT" "$KCM_PORT" "$SCHED_PORT" "$KWOK_PORT" >"$STATE/ports"
printf 'KUEUE_WEBHOOK_PORT=%s\nKUEUE_HEALTH_PORT=%s\n' "$KUEUE_WEBHOOK_PORT" "$KUEUE_HEALTH_PORT" >>"$STATE/ports"

# --- certificates: one CA for the API server, its clients and the kubelet endpoint -------------------
C=$STATE/certs && mkdir -p "$C"
ossl() { openssl "$@" 2>/dev/null; }
ossl req -x509 -newkey rsa:2048 -nodes -keyout "$C/ca.key" -out "$C/ca.crt" -days 30 -subj "/CN=hvdk8s-test-ca"
sign() {  # name, subject, extensions
  ossl req -newkey rsa:2048 -nodes -keyout "$C/$1.key" -out "$C/$1.csr" -subj "$2"
  printf '%s\n' "$3" >"$C/$1.ext"
  ossl x509 -req -in "$C/$1.csr" -CA "$C/ca.crt" -CAkey "$C/ca.key" -CAcreateserial -days 30 \
    -extfile "$C/$1.ext" -out "$C/$1.crt"
}
sign apiserver "/CN=kube-apiserver" "subjectAltName=IP:127.0.0.1,DNS:localhost
extendedKeyUsage=serverAuth"
sign kubelet "/CN=127.0.0.1" "subjectAltName=IP:127.0.0.1,DNS:localhost
extendedKeyUsage=serverAuth"
sign apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" "extendedKeyUsage=clientAuth"
if [ "$KUEUE" = 1 ]; then  # Kueue's webhook server: tls.crt/tls.key in its certDir
  sign kueue-webhook "/CN=kueue-webhook" "subjectAltName=IP:127.0.0.1,DNS:localhost
extendedKeyUsage=serverAuth"
  mkdir -p "$C/kueue" && cp "$C/kueue-webhook.crt" "$C/kueue/tls.crt" && cp "$C/kueue-webhook.key" "$C/kueue/tls.key"
fi
ossl genrsa -out "$C/sa.key" 2048
ossl rsa -in "$C/sa.key" -pubout -out "$C/sa.pub"
chmod 600 "$C"/*.key
ADMIN_TOKEN=$(openssl rand -hex 16) NOBODY_TOKEN=$(openssl rand -hex 16)
printf '%s,admin,uid-admin,"system:masters"\n%s,nobody,uid-nobody\n' "$ADMIN_TOKEN" "$NOBODY_TOKEN" >"$C/tokens.csv"
chmod 600 "$C/tokens.csv"
KUBECONFIG_FILE=$STATE/kubeconfig
cat >"$KUBECONFIG_FILE" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: hvdk8s-test
  cluster: {server: "https://127.0.0.1:$API_PORT", certificate-authority-data: "$(base64 -w0 <"$C/ca.crt")"}
users:
- {name: admin, user: {token: "$ADMIN_TOKEN"}}
- {name: nobody, user: {token: "$NOBODY_TOKEN"}}
contexts:
- {name: hvdk8s-test, context: {cluster: hvdk8s-test, user: admin, namespace: default}}
- {name: hvdk8s-test-nobody, context: {cluster: hvdk8s-test, user: nobody, namespace: default}}
current-context: hvdk8s-test
EOF
chmod 600 "$KUBECONFIG_FILE"
kc() { kubectl --kubeconfig "$KUBECONFIG_FILE" "$@"; }
lap certs

# --- etcd ----------------------------------------------------------------------------------------------
say "etcd on 127.0.0.1:$ETCD_PORT"
setsid "$BIN/etcd" --name default --data-dir "$STATE/etcd-data" \
  --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
  --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
  --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
  --initial-cluster "default=http://127.0.0.1:$ETCD_PEER_PORT" \
  --listen-metrics-urls "" >"$STATE/etcd.log" 2>&1 </dev/null &
echo $! >"$STATE/etcd.pid"

# --- kube-apiserver ------------------------------------------------------------------------------------
say "kube-apiserver on https://127.0.0.1:$API_PORT"
# Kept as a script so that --apiserver-only starts the very same server again (exec: the pid is its own).
cat >"$STATE/apiserver.cmd" <<APISERVER
exec "$BIN/kube-apiserver" \\
  --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$API_PORT" \\
  --etcd-servers "http://127.0.0.1:$ETCD_PORT" \\
  --cert-dir "$C" --tls-cert-file "$C/apiserver.crt" --tls-private-key-file "$C/apiserver.key" \\
  --client-ca-file "$C/ca.crt" --token-auth-file "$C/tokens.csv" \\
  --authorization-mode RBAC --enable-admission-plugins PodSecurity --allow-privileged=true \\
  --service-account-key-file "$C/sa.pub" --service-account-signing-key-file "$C/sa.key" \\
  --service-account-issuer "https://127.0.0.1:$API_PORT" --api-audiences "https://127.0.0.1:$API_PORT" \\
  --service-cluster-ip-range 10.96.0.0/24 \\
  --kubelet-certificate-authority "$C/ca.crt" --kubelet-client-certificate "$C/apiserver-kubelet-client.crt" \\
  --kubelet-client-key "$C/apiserver-kubelet-client.key" --kubelet-preferred-address-types InternalIP \\
  --profiling=false
APISERVER
setsid bash "$STATE/apiserver.cmd" >"$STATE/apiserver.log" 2>&1 </dev/null &
echo $! >"$STATE/apiserver.pid"
wait_apiserver
lap apiserver-ready

# --- the MPIJob CRD, from the operator's module (kubectl create: plain apply overflows the annotation) ---
say "installing the MPIJob CRD from $CRD"
kc create -f "$CRD" -o name >/dev/null
for _ in $(seq 1 240); do  # Established (Debian's kubectl 1.20 `wait` fails while .status is still empty)
  [ "$(kc get crd mpijobs.kubeflow.org -o jsonpath='{.status.conditions[?(@.type=="Established")].status}' \
       2>/dev/null)" = True ] && { est=1; break; }
  sleep 0.25
done
[ "${est:-0}" = 1 ] || die "the MPIJob CRD did not become established in 60s"
lap crd-established

# --- kube-controller-manager and kube-scheduler ----------------------------------------------------------
# node-lifecycle-controller lifts the node.kubernetes.io/not-ready taint that the API server's
# TaintNodesByCondition admission puts on every new Node (no pod is scheduled until then): always on, for
# kwok's nodes and for a real one that scripts/k8s/node.sh adds later (idle while there are no nodes).
KCM_CONTROLLERS=job-controller,garbage-collector-controller,endpointslice-controller,namespace-controller
KCM_CONTROLLERS+=,serviceaccount-controller,root-ca-certificate-publisher-controller,node-lifecycle-controller
say "kube-controller-manager on https://127.0.0.1:$KCM_PORT, kube-scheduler on https://127.0.0.1:$SCHED_PORT"
setsid "$BIN/kube-controller-manager" \
  --controllers="$KCM_CONTROLLERS" \
  --kubeconfig "$KUBECONFIG_FILE" --leader-elect=false --use-service-account-credentials=false \
  --root-ca-file "$C/ca.crt" --bind-address 127.0.0.1 --secure-port "$KCM_PORT" \
  --cert-dir "$C/controller-manager" --profiling=false >"$STATE/controller-manager.log" 2>&1 </dev/null &
echo $! >"$STATE/controller-manager.pid"
setsid "$BIN/kube-scheduler" --kubeconfig "$KUBECONFIG_FILE" --leader-elect=false \
  --bind-address 127.0.0.1 --secure-port "$SCHED_PORT" --cert-dir "$C/scheduler" \
  --profiling=false >"$STATE/scheduler.log" 2>&1 </dev/null &
echo $! >"$STATE/scheduler.pid"

# --- Kueue, as a process on 127.0.0.1 (before the operator, so that no launcher races admission) ---------
if [ "$KUEUE" = 1 ]; then
  frameworks=batch/job,kubeflow.org/mpijob
  # PyYAML: the project's venv has it (a bare machine's python3 may not)
  py=$HERE/../../.venv/bin/python; [ -x "$py" ] || py=python3
  "$py" "$HERE/kueue-manifests-135.py" "$(dirname "$BIN")/kueue" "https://127.0.0.1:$KUEUE_WEBHOOK_PORT" \
    "$C/ca.crt" "$frameworks" >"$STATE/kueue-manifests.yaml"
  for name in $(kc create -f "$STATE/kueue-manifests.yaml" -o name | grep customresourcedefinition); do
    for _ in $(seq 1 240); do
      [ "$(kc get "$name" -o jsonpath='{.status.conditions[?(@.type=="Established")].status}' 2>/dev/null)" = True ] &&
        continue 2
      sleep 0.25
    done
    die "$name did not become established in 60s"
  done
  cat >"$STATE/kueue-config.yaml" <<KUEUECONFIG
apiVersion: config.kueue.x-k8s.io/v1beta2
kind: Configuration
namespace: kueue-system
health: {healthProbeBindAddress: "127.0.0.1:$KUEUE_HEALTH_PORT"}
metrics: {bindAddress: "0"}
webhook: {port: $KUEUE_WEBHOOK_PORT, host: 127.0.0.1, certDir: "$C/kueue"}
leaderElection: {leaderElect: false}
internalCertManagement: {enable: false}
integrations: {frameworks: [$(echo "$frameworks" | sed 's/,/, /g')]}
KUEUECONFIG
  say "kueue: webhooks on https://127.0.0.1:$KUEUE_WEBHOOK_PORT, health on 127.0.0.1:$KUEUE_HEALTH_PORT"
  # With internalCertManagement off, Kueue v0.17.1 reads its metrics server's certificate from the fixed
  # path /etc/kueue/metrics/certs (cmd/kueue/main.go), even with metrics off, and exits without it. It
  # runs in a mount namespace of its own where /etc is an overlay whose upper layer is in STATE_DIR, so
  # that path exists for it alone and the machine's /etc is untouched.
  # Kept as a script so that --apiserver-only starts it again (exec: the pid is Kueue's own).
  cat >"$STATE/kueue.cmd" <<KUEUECMD
export KUBECONFIG="$KUBECONFIG_FILE"
mount -t overlay overlay -o "lowerdir=/etc,upperdir=$STATE/kueue-etc/upper,workdir=$STATE/kueue-etc/work" /etc
mkdir -p /etc/kueue/metrics/certs && cp "$C/kueue/tls.crt" "$C/kueue/tls.key" /etc/kueue/metrics/certs/
exec "$BIN/kueue" --config "$STATE/kueue-config.yaml" --feature-gates VisibilityOnDemand=false
KUEUECMD
  mkdir -p "$STATE/kueue-etc/upper" "$STATE/kueue-etc/work"
  : >"$STATE/kueue.log"
  start_kueue
  lap kueue-ready
fi

# --- the MPI operator, in a network namespace of its own (see the top) --------------------------------
if [ "$OPERATOR" = 1 ]; then
  kc create namespace mpi-operator >/dev/null  # its leader-election Lease lives there (--lock-namespace)
  rm -f "$STATE/apiserver.sock"
  setsid socat "UNIX-LISTEN:$STATE/apiserver.sock,fork,mode=600" "TCP:127.0.0.1:$API_PORT" \
    >"$STATE/api-relay.log" 2>&1 </dev/null &
  echo $! >"$STATE/api-relay.pid"
  for _ in $(seq 1 40); do [ -S "$STATE/apiserver.sock" ] && break; sleep 0.05; done
  say "mpi-operator $("$BIN/mpi-operator" --version | sed -n 's/^Version: //p') (network namespace of its own)"
  # Kept as a script so that --apiserver-only starts it again (exec: the pid is the operator's own).
  cat >"$STATE/mpi-operator.cmd" <<OPERATOR
ip link set lo up
socat TCP-LISTEN:$API_PORT,bind=127.0.0.1,fork,reuseaddr UNIX-CONNECT:$STATE/apiserver.sock \\
  >"$STATE/operator-relay.log" 2>&1 </dev/null &
echo \$! >"$STATE/operator-relay.pid"
exec "$BIN/mpi-operator" --kubeConfig "$KUBECONFIG_FILE" --monitoring-port 0 --threadiness 2 \\
  --kube-api-qps 50 --kube-api-burst 100
OPERATOR
  start_operator
fi

# --- kwok fake nodes ---------------------------------------------------------------------------------------
if [ "$KWOK_NODES" -gt 0 ]; then
  say "kwok with $KWOK_NODES fake nodes ($NODE_GPUS nvidia.com/gpu each), its server on 127.0.0.1:$KWOK_PORT"
  # kwok's server (a node's kubelet API) with the certificate the API server verifies kubelets by.
  setsid "$BIN/kwok" --config "${KWOK_STAGES:-$(dirname "$BIN")/kwok/stages.yaml}" --kubeconfig "$KUBECONFIG_FILE" \
    --manage-all-nodes=false \
    --manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake --cidr 10.244.0.1/16 --node-ip 127.0.0.1 \
    --server-address "127.0.0.1:$KWOK_PORT" --node-port "${KWOK_NODE_PORT:-$KWOK_PORT}" \
    --tls-cert-file "$C/kubelet.crt" --tls-private-key-file "$C/kubelet.key" --node-lease-duration-seconds 40 \
    >"$STATE/kwok.log" 2>&1 </dev/null &
  echo $! >"$STATE/kwok.pid"
  for i in $(seq 0 $((KWOK_NODES - 1))); do
    cat <<EOF
---
apiVersion: v1
kind: Node
metadata:
  name: kwok-node-$i
  annotations: {kwok.x-k8s.io/node: fake, node.alpha.kubernetes.io/ttl: "0"}
  labels: {type: kwok, kubernetes.io/hostname: kwok-node-$i, kubernetes.io/os: linux, kubernetes.io/arch: amd64}
status:
  # Both addresses a kubelet reports: kwok's node-initialize stage, run again when a node's lease lapsed (the
  # API server stopped for a minute), writes an empty "addresses:" when either is missing (its NodeName is
  # empty here), and the API server then cannot reach the node for pods/log ("no preferred addresses found").
  addresses: [{type: InternalIP, address: 127.0.0.1}, {type: Hostname, address: kwok-node-$i}]
  allocatable: {cpu: "32", memory: 256Gi, pods: "110", nvidia.com/gpu: "$NODE_GPUS", rdma/ib: "1"}
  capacity: {cpu: "32", memory: 256Gi, pods: "110", nvidia.com/gpu: "$NODE_GPUS", rdma/ib: "1"}
EOF
  done | kc create -f - >/dev/null
fi

# --- ready: controller-manager and scheduler healthy, the operator leading, kwok's nodes Ready ----------
healthy() { [ "$(curl -sk --max-time 2 "https://127.0.0.1:$1/healthz" 2>/dev/null)" = ok ]; }
for _ in $(seq 1 480); do
  for n in controller-manager scheduler $([ "$OPERATOR" = 1 ] && echo mpi-operator api-relay) \
      $([ "$KWOK_NODES" -gt 0 ] && echo kwok); do
    alive "$n" || { tail -n 20 "$STATE/$n.log" >&2; die "$n exited (log: $STATE/$n.log)"; }
  done
  healthy "$KCM_PORT" && healthy "$SCHED_PORT" || { sleep 0.25; continue; }
  [ -n "${kcm_lap:-}" ] || { lap controller-manager+scheduler-healthy; kcm_lap=1; }
  if [ "$OPERATOR" = 1 ] && ! grep -q "Leading started" "$STATE/mpi-operator.log"; then sleep 0.25; continue; fi
  [ -n "${op_lap:-}" ] || { lap mpi-operator-leading; op_lap=1; }
  # kwok's nodes Ready and untainted (schedulable)
  if [ "$KWOK_NODES" -gt 0 ] && [ "$(kc get nodes -l type=kwok --no-headers \
      -o custom-columns='R:.status.conditions[?(@.type=="Ready")].status,T:.spec.taints' 2>/dev/null |
      grep -c '^True *<none>$')" -lt "$KWOK_NODES" ]; then
    sleep 0.25; continue
  fi
  ready2=1; break
done
[ "${ready2:-0}" = 1 ] || die "the cluster was not ready after 120s (logs in $STATE)"
lap all-ready
say "ready in $((SECONDS - started))s: KUBECONFIG=$STATE/kubeconfig"
echo "$KUBECONFIG_FILE"
