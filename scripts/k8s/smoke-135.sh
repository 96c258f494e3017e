#!/usr/bin/env bash
# By-hand check of the 1.35 stack (issue 28), not a test: start it (scripts/k8s/start-135.sh), create an
# MPIJob that hvdk8s rendered, and show what the real MPI operator made of it: the worker Pods, the
# launcher Job, the MPIJob's conditions, and the events. With --kwok-nodes N the pods are scheduled on
# kwok's fake nodes and "run", so the operator's WaitForWorkersReady policy lets the launcher be created.
#
#   scripts/k8s/smoke-135.sh HVDK8S RENDER_DIR [--kwok-nodes N] [--job FILE] [--kueue-gpus G] [--keep]
#     HVDK8S: the hvdk8s command (e.g. .venv/bin/hvdk8s); RENDER_DIR: a folder for `hvdk8s render`.
#     The namespace `hvdk8s-smoke` enforces PodSecurity `restricted` (the level hvdk8s renders for).
#     --job: the job file (default examples/digits.yaml).
#     --kueue-gpus G: start Kueue too, with a ClusterQueue `cq` (flavor `default`: 64 CPUs, 512Gi, G GPUs)
#     and a LocalQueue `team-a` in the namespace; the job is rendered with kubernetes.queue=team-a.
#     --keep leaves the cluster running (state in $RENDER_DIR/cluster; stop with stop-135.sh).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
[ $# -ge 2 ] || { echo "usage: smoke-135.sh HVDK8S RENDER_DIR [--kwok-nodes N] [--job FILE] [--kueue-gpus G] [--keep]" >&2; exit 2; }
HVDK8S=$1 OUTDIR=$(mkdir -p "$2" && cd "$2" && pwd); shift 2
NODES=0 KEEP=0 JOB=$ROOT/examples/digits.yaml KUEUE_GPUS=""
while [ $# -gt 0 ]; do
  case $1 in --kwok-nodes) NODES=$2; shift 2 ;; --keep) KEEP=1; shift ;; --job) JOB=$2; shift 2 ;; --kueue-gpus) KUEUE_GPUS=$2; shift 2 ;; *) echo "unknown $1" >&2; exit 2 ;; esac
done
STATE=$OUTDIR/cluster NS=hvdk8s-smoke
export KUBECONFIG
KUBECONFIG=$(bash "$HERE/start-135.sh" "$STATE" --kwok-nodes "$NODES" ${KUEUE_GPUS:+--kueue} | tail -n1)
[ "$KEEP" = 1 ] || trap 'bash "$HERE/stop-135.sh" "$STATE"' EXIT
cat "$STATE/start-times.txt"

kubectl create namespace "$NS" >/dev/null
kubectl label namespace "$NS" pod-security.kubernetes.io/enforce=restricted \
  pod-security.kubernetes.io/warn=restricted >/dev/null
# The default ServiceAccount (the ServiceAccount admission plugin rejects pods until it exists).
for _ in $(seq 1 40); do kubectl -n "$NS" get serviceaccount default >/dev/null 2>&1 && break; sleep 0.25; done

set_queue=()
if [ -n "$KUEUE_GPUS" ]; then
  kubectl apply --server-side -f - <<EOF
apiVersion: kueue.x-k8s.io/v1beta2
kind: ResourceFlavor
metadata: {name: default}
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: ClusterQueue
metadata: {name: cq}
spec:
  namespaceSelector: {}
  resourceGroups:
  - coveredResources: [cpu, memory, nvidia.com/gpu]
    flavors:
    - name: default
      resources:
      - {name: cpu, nominalQuota: "64"}
      - {name: memory, nominalQuota: 512Gi}
      - {name: nvidia.com/gpu, nominalQuota: "$KUEUE_GPUS"}
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: LocalQueue
metadata: {name: team-a, namespace: $NS}
spec: {clusterQueue: cq}
EOF
  set_queue=(--set kubernetes.queue=team-a)
fi
"$HVDK8S" render "$JOB" "${set_queue[@]}" -o "$OUTDIR/render" >/dev/null
sed -i "s/^  namespace: default$/  namespace: $NS/; s/^namespace: default$/namespace: $NS/" "$OUTDIR/render"/*.yaml
echo "== kubectl apply --server-side (the 1.35 server's answer, warnings included)"
kubectl apply --server-side -k "$OUTDIR/render" 2>&1
t0=$(date +%s.%N)
name=$(kubectl -n "$NS" get mpijobs -o jsonpath='{.items[0].metadata.name}')
workers=$(kubectl -n "$NS" get mpijob "$name" -o jsonpath='{.spec.mpiReplicaSpecs.Worker.replicas}')
for _ in $(seq 1 240); do
  n=$(kubectl -n "$NS" get pods -l training.kubeflow.org/job-role=worker --no-headers 2>/dev/null | wc -l)
  [ "$n" -ge "$workers" ] && break; sleep 0.25
done
awk -v a="$(date +%s.%N)" -v b="$t0" 'BEGIN { printf "== %d worker pod(s) created by the operator %.1fs after the MPIJob\n", '"${n:-0}"', a - b }'
if [ "$NODES" -gt 0 ]; then
  for _ in $(seq 1 240); do kubectl -n "$NS" get job "$name-launcher" >/dev/null 2>&1 && { launcher=1; break; }; sleep 0.25; done
  if [ "${launcher:-0}" = 1 ]; then
    awk -v a="$(date +%s.%N)" -v b="$t0" 'BEGIN { printf "== launcher Job seen %.1fs after the MPIJob", a - b }'
    echo " (suspend: $(kubectl -n "$NS" get job "$name-launcher" -o jsonpath='{.spec.suspend}'))"
  else
    echo "== no launcher Job 60s after the MPIJob"
  fi
  # kwok marks the launcher pod (Job-owned) Succeeded a second after Ready: the operator should end the job.
  for _ in $(seq 1 240); do
    kubectl -n "$NS" get mpijob "$name" -o jsonpath='{.status.conditions[*].type}' | grep -qwE 'Succeeded|Failed' && break
    sleep 0.25
  done
  awk -v a="$(date +%s.%N)" -v b="$t0" 'BEGIN { printf "== MPIJob finished (or 60s passed) %.1fs after it was created\n", a - b }'
fi
sleep 2
echo "== objects"
kubectl -n "$NS" get mpijob,jobs,pods,services,configmaps,secrets,endpointslices -o wide 2>&1
if [ -n "$KUEUE_GPUS" ]; then
  echo "== Kueue"
  kubectl -n "$NS" get workloads -o wide 2>&1
  kubectl -n "$NS" get workloads -o jsonpath='{range .items[*]}{.metadata.name}: {range .status.conditions[*]}{.type}={.status} ({.reason}: {.message}) {end}{"\n"}{end}'
  kubectl get clusterqueue cq -o jsonpath='{.status.flavorsReservation}{"\n"}' 2>&1
  echo "suspend: $(kubectl -n "$NS" get mpijob "$name" -o jsonpath='{.spec.runPolicy.suspend}')"
fi
echo "== MPIJob status"
kubectl -n "$NS" get mpijob "$name" -o jsonpath='{range .status.conditions[*]}{.type}={.status} {.reason}: {.message}{"\n"}{end}{.status.replicaStatuses}{"\n"}'
echo "== events"
kubectl -n "$NS" get events --sort-by=.lastTimestamp -o custom-columns=OBJ:.involvedObject.name,TYPE:.type,REASON:.reason,MSG:.message 2>&1 | tail -n 40
kubectl -n "$NS" get mpijob "$name" -o yaml >"$OUTDIR/mpijob-served.yaml"
kubectl -n "$NS" get pods -o yaml >"$OUTDIR/pods-served.yaml"
kubectl -n "$NS" get jobs -o yaml >"$OUTDIR/jobs-served.yaml" 2>/dev/null || true
kubectl -n "$NS" get configmap "$name-config" -o yaml >"$OUTDIR/configmap-served.yaml" 2>/dev/null || true
echo "== served objects saved in $OUTDIR (mpijob-served.yaml, pods-served.yaml, jobs-served.yaml)"
