#!/usr/bin/env bash
# Stop what scripts/k8s/start.sh started in STATE_DIR: the controller-manager, the API server, then etcd
# (or, with --apiserver-only, the API server alone; the controller-manager waits for it to come back).
# Only the processes whose pids start.sh recorded, and only if they still run the binaries it started;
# SIGTERM first, SIGKILL after 10 s.
set -euo pipefail

[ $# -ge 1 ] || { echo "usage: stop.sh STATE_DIR [--apiserver-only]" >&2; exit 2; }
STATE=$1
names=(controller-manager apiserver etcd)
[ "${2:-}" = --apiserver-only ] && names=(apiserver)

for name in "${names[@]}"; do
  pidfile=$STATE/$name.pid
  [ -f "$pidfile" ] || continue
  pid=$(cat "$pidfile")
  case $name in apiserver | controller-manager) binary=kube-$name ;; *) binary=$name ;; esac
  # A recycled pid belongs to someone else: leave it alone.
  if kill -0 "$pid" 2>/dev/null && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q "/$binary "; then
    kill -TERM "$pid"
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
    printf '\033[1m[k8s-stop]\033[0m stopped %s (pid %s)\n' "$binary" "$pid" >&2
  fi
  rm -f "$pidfile"
done
