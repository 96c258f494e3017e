#!/usr/bin/env bash
# Start a private Kubernetes API server for tests: etcd + kube-apiserver v1.20.2 on 127.0.0.1 only, and
# kube-controller-manager running only its garbage collector (so that ownerReferences cascade as on a real
# cluster), from the binaries scripts/k8s/build.sh caches (built first if missing).
#
#   scripts/k8s/start.sh STATE_DIR [--crd FILE]   start all three; install the CRD in FILE (e.g. the MPIJob
#                                                  CRD) before the garbage collector reads what is served
#   scripts/k8s/start.sh STATE_DIR --apiserver-only  start the API server again over the running etcd
#   scripts/k8s/stop.sh STATE_DIR [--apiserver-only] stop what this started
#
# STATE_DIR gets the certificates (a self-signed CA), the token file, the logs, the pids and
# `kubeconfig`, with two users: `admin` (system:masters; context hvdk8s-test, the current one) and
# `nobody` (authenticated, no RBAC rights; context hvdk8s-test-nobody). RBAC is on; the ServiceAccount
# admission plugin is off (no token controller makes the tokens it waits for). Pod logs are proxied
# to a kubelet at a Node's InternalIP, verified against this CA with certs/kubelet.{crt,key} (a test can
# serve that kubelet endpoint itself). Prints the kubeconfig path on its last line.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
say() { printf '\033[1m[k8s-start]\033[0m %s\n' "$*" >&2; }
die() { printf '\033[1;31m[k8s-start] error:\033[0m %s\n' "$*" >&2; exit 1; }

[ $# -ge 1 ] || die "usage: start.sh STATE_DIR [--crd FILE | --apiserver-only]"
STATE=$(mkdir -p "$1" && cd "$1" && pwd); shift
CRD="" ONLY_APISERVER=0
while [ $# -gt 0 ]; do
  case $1 in
    --crd) CRD=$(cd "$(dirname "$2")" && pwd)/$(basename "$2"); shift 2 ;;
    --apiserver-only) ONLY_APISERVER=1; shift ;;
    *) die "unknown argument $1" ;;
  esac
done
started=$SECONDS
BIN=$(bash "$HERE/build.sh" | tail -n1)
# A start that fails half-way stops what it started (the API server alone in --apiserver-only mode).
arm_cleanup() {
  trap 'code=$?; [ $code -eq 0 ] || bash "$HERE/stop.sh" "$STATE" $([ "$ONLY_APISERVER" = 1 ] && echo --apiserver-only)' EXIT
}

alive() { [ -f "$STATE/$1.pid" ] && kill -0 "$(cat "$STATE/$1.pid")" 2>/dev/null; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

if [ "$ONLY_APISERVER" = 1 ]; then
  [ -f "$STATE/ports" ] && alive etcd || die "$STATE has no running etcd: start both first"
  alive apiserver && die "the API server of $STATE is already running"
  # shellcheck disable=SC1091
  . "$STATE/ports"
else
  { alive etcd || alive apiserver || alive controller-manager; } &&
    die "$STATE already has a running cluster: stop it first (stop.sh $STATE)"
  rm -rf "$STATE/etcd-data" "$STATE/certs"
  ETCD_PORT=$(free_port) ETCD_PEER_PORT=$(free_port) API_PORT=$(free_port) KCM_PORT=$(free_port)
  printf 'ETCD_PORT=%s\nETCD_PEER_PORT=%s\nAPI_PORT=%s\nKCM_PORT=%s\n' "$ETCD_PORT" "$ETCD_PEER_PORT" "$API_PORT" \
    "$KCM_PORT" >"$STATE/ports"

  # --- certificates: one CA for the API server, its clients and the kubelet endpoint ------------------
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
  ossl genrsa -out "$C/sa.key" 2048
  ossl rsa -in "$C/sa.key" -pubout -out "$C/sa.pub"
  chmod 600 "$C"/*.key
  ADMIN_TOKEN=$(openssl rand -hex 16) NOBODY_TOKEN=$(openssl rand -hex 16)
  printf '%s,admin,uid-admin,"system:masters"\n%s,nobody,uid-nobody\n' "$ADMIN_TOKEN" "$NOBODY_TOKEN" >"$C/tokens.csv"
  chmod 600 "$C/tokens.csv"

  # --- kubeconfig: two users, two contexts ------------------------------------------------------------
  KUBECONFIG_FILE=$STATE/kubeconfig
  ca_data=$(base64 -w0 <"$C/ca.crt")
  cat >"$KUBECONFIG_FILE" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: hvdk8s-test
  cluster: {server: "https://127.0.0.1:$API_PORT", certificate-authority-data: "$ca_data"}
users:
- {name: admin, user: {token: "$ADMIN_TOKEN"}}
- {name: nobody, user: {token: "$NOBODY_TOKEN"}}
contexts:
- {name: hvdk8s-test, context: {cluster: hvdk8s-test, user: admin, namespace: default}}
- {name: hvdk8s-test-nobody, context: {cluster: hvdk8s-test, user: nobody, namespace: default}}
current-context: hvdk8s-test
EOF
  chmod 600 "$KUBECONFIG_FILE"

  # --- etcd --------------------------------------------------------------------------------------------
  say "etcd on 127.0.0.1:$ETCD_PORT"
  arm_cleanup
  setsid "$BIN/etcd" --name default --data-dir "$STATE/etcd-data" \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster "default=http://127.0.0.1:$ETCD_PEER_PORT" \
    --listen-metrics-urls "" >"$STATE/etcd.log" 2>&1 </dev/null &
  echo $! >"$STATE/etcd.pid"
fi

C=$STATE/certs
say "kube-apiserver on https://127.0.0.1:$API_PORT"
arm_cleanup
setsid "$BIN/kube-apiserver" \
  --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$API_PORT" --insecure-port 0 \
  --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
  --cert-dir "$C" --tls-cert-file "$C/apiserver.crt" --tls-private-key-file "$C/apiserver.key" \
  --client-ca-file "$C/ca.crt" --token-auth-file "$C/tokens.csv" \
  --authorization-mode RBAC --disable-admission-plugins ServiceAccount \
  --service-account-key-file "$C/sa.pub" --service-account-signing-key-file "$C/sa.key" \
  --service-account-issuer "https://127.0.0.1:$API_PORT" --api-audiences "https://127.0.0.1:$API_PORT" \
  --service-cluster-ip-range 10.96.0.0/24 \
  --kubelet-certificate-authority "$C/ca.crt" --kubelet-client-certificate "$C/apiserver-kubelet-client.crt" \
  --kubelet-client-key "$C/apiserver-kubelet-client.key" --kubelet-preferred-address-types InternalIP \
  --profiling=false >"$STATE/apiserver.log" 2>&1 </dev/null &
echo $! >"$STATE/apiserver.pid"

# Ready: /readyz answers ok (etcd reached, RBAC's bootstrap roles in place).
token=$(sed -n '1s/,.*//p' "$C/tokens.csv")
for _ in $(seq 1 240); do
  alive apiserver || { tail -n 20 "$STATE/apiserver.log" >&2; die "kube-apiserver exited (log: $STATE/apiserver.log)"; }
  alive etcd || { tail -n 20 "$STATE/etcd.log" >&2; die "etcd exited (log: $STATE/etcd.log)"; }
  if [ "$(curl -s --max-time 2 --cacert "$C/ca.crt" -H "Authorization: Bearer $token" \
      "https://127.0.0.1:$API_PORT/readyz" 2>/dev/null)" = ok ]; then
    ready=1; break
  fi
  sleep 0.25
done
[ "${ready:-0}" = 1 ] || { tail -n 20 "$STATE/apiserver.log" >&2; die "kube-apiserver not ready after 60s"; }

if [ -n "$CRD" ]; then
  say "installing the CRD in $CRD (kubectl create: plain apply overflows the annotation limit)"
  names=$(kubectl --kubeconfig "$STATE/kubeconfig" create -f "$CRD" -o name)
  for name in $names; do  # Established, as the API server reports it (status appears a moment later)
    for _ in $(seq 1 240); do
      [ "$(kubectl --kubeconfig "$STATE/kubeconfig" get "$name" \
           -o jsonpath='{.status.conditions[?(@.type=="Established")].status}' 2>/dev/null)" = True ] && continue 2
      sleep 0.25
    done
    die "$name did not become established in 60s"
  done
fi

# --- the garbage collector: kube-controller-manager with that controller alone -------------------------
# Started after the CRD so that its first discovery already watches MPIJobs (it rediscovers every 30 s).
# It acts as admin (system:masters: the kubeconfig's current context); no leader election (one instance);
# its HTTPS port (/healthz, a self-signed certificate) on loopback only, the insecure port off.
if [ "$ONLY_APISERVER" = 0 ]; then
  say "kube-controller-manager (garbage collector only), /healthz on https://127.0.0.1:$KCM_PORT"
  setsid "$BIN/kube-controller-manager" --controllers=garbagecollector \
    --kubeconfig "$STATE/kubeconfig" --leader-elect=false --use-service-account-credentials=false \
    --bind-address 127.0.0.1 --secure-port "$KCM_PORT" --port 0 --cert-dir "$C/controller-manager" \
    --profiling=false >"$STATE/controller-manager.log" 2>&1 </dev/null &
  echo $! >"$STATE/controller-manager.pid"
  # Ready: every resource's informer has synced, so a deleted owner's dependents are collected at once.
  for _ in $(seq 1 240); do
    alive controller-manager || { tail -n 20 "$STATE/controller-manager.log" >&2
      die "kube-controller-manager exited (log: $STATE/controller-manager.log)"; }
    grep -q "all resource monitors have synced" "$STATE/controller-manager.log" && { gc=1; break; }
    sleep 0.25
  done
  [ "${gc:-0}" = 1 ] ||
    { tail -n 20 "$STATE/controller-manager.log" >&2; die "the garbage collector did not sync in 60s"; }
fi
say "ready in $((SECONDS - started))s: KUBECONFIG=$STATE/kubeconfig"
echo "$STATE/kubeconfig"
