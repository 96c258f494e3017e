#!/usr/bin/env bash
# Stop what scripts/k8s/start-135.sh started in STATE_DIR, the clients first and etcd last. Only the
# processes whose pids it recorded, and only if they still run what it started (a recycled pid belongs to
# someone else); SIGTERM first, SIGKILL after 10 s (after 1 s with --apiserver-only: with its clients still
# running, kube-apiserver's graceful shutdown waits for their open watch connections, measured >15 s; the
# tests stop it to see a server that is down, which a kill shows as well).
set -euo pipefail

[ $# -ge 1 ] || { echo "usage: stop-135.sh STATE_DIR [--apiserver-only]" >&2; exit 2; }
STATE=$1
ENTRIES=(kwok:/kwok kueue:/kueue mpi-operator:/mpi-operator operator-relay:socat api-relay:socat
  scheduler:/kube-scheduler controller-manager:/kube-controller-manager apiserver:/kube-apiserver etcd:/etcd)
# The operator and Kueue with it: the operator exits on its own once it cannot renew its leader lease, and
# Kueue as deployed would too (start-135.sh --apiserver-only starts them again).
GRACE=100  # tenths of a second
[ "${2:-}" = --apiserver-only ] && ENTRIES=(kueue:/kueue mpi-operator:/mpi-operator operator-relay:socat apiserver:/kube-apiserver) GRACE=10
# Gone: exited, or a zombie waiting for its reaper (here PID 1 reaps about once a second).
running() { kill -0 "$1" 2>/dev/null && [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" != Z ]; }
# name:what its command line must contain
for entry in "${ENTRIES[@]}"; do
  name=${entry%%:*} binary=${entry#*:}
  pidfile=$STATE/$name.pid
  [ -f "$pidfile" ] || continue
  pid=$(cat "$pidfile")
  if running "$pid" && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q -- "$binary"; then
    kill -TERM "$pid"
    for _ in $(seq 1 "$GRACE"); do running "$pid" || break; sleep 0.1; done
    running "$pid" && kill -KILL "$pid"
    printf '\033[1m[k8s-stop]\033[0m stopped %s (pid %s)\n' "$name" "$pid" >&2
  fi
  rm -f "$pidfile"
done
[ "${2:-}" = --apiserver-only ] || rm -f "$STATE/apiserver.sock"
