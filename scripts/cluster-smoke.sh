#!/usr/bin/env bash
# Smoke test of the real single-node cluster (scripts/cluster.sh): up, the
# example controller (examples/controller.rs) deployed by deploy/'s manifests
# (kustomize: the namespace, 2 replicas, the image built here by
# scripts/oci-image.py), RBAC on leases, the identity from the downward API
# (POD_NAME); a
# Lease held by one of its pods, which leads once the creation hold is over
# (one lease duration after it created the Lease); that pod deleted; the Lease
# held, within less than a lease duration (released on SIGTERM, not expired),
# by another pod, which leads; down. Every wait is bounded.
#
# usage: scripts/cluster-smoke.sh
#
# Environment:
#   KRL_SMOKE_KEEP=1       leave the cluster up at the end (and on failure)
#   KRL_SMOKE_TIMEOUT      seconds for each wait (default 120)
#   KRL_SMOKE_PROFILE      cargo profile of the controller (default release)
#   and those of scripts/cluster.sh (KRL_CLUSTER_DIR, ...).
# Root only, like scripts/cluster.sh.
set -euo pipefail
# All of it in one function, read whole before it runs (editing this file
# during a run is then safe).
main() {

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
timeout_s="${KRL_SMOKE_TIMEOUT:-120}"
profile="${KRL_SMOKE_PROFILE:-release}"
ns=krl-smoke
app=configmap-controller
image=krl.local/configmap-controller:smoke
t0=$SECONDS

script=cluster-smoke.sh
# step, die, now_ms, wait_for, diagnose
# shellcheck source=scripts/lib/cluster-test.sh
. "$root/scripts/lib/cluster-test.sh"

finish() {
  local rc=$?
  trap - EXIT
  if [ "${KRL_SMOKE_KEEP:-0}" = 1 ]; then
    step "left the cluster up (KRL_SMOKE_KEEP=1): scripts/cluster.sh down stops it"
    exit "$rc"
  fi
  step "down"
  if ! scripts/cluster.sh down; then
    [ "$rc" != 0 ] || rc=1
  fi
  if [ "$rc" = 0 ]; then
    step "smoke test passed in $((SECONDS - t0)) s"
  else
    step "smoke test FAILED (exit $rc)"
  fi
  exit "$rc"
}

[ "$(id -u)" = 0 ] || die "needs root (scripts/cluster.sh up runs kubelet and containerd)"

step "building the controller example (cargo build --profile $profile)"
nice -n 19 cargo build --quiet --locked --profile "$profile" -p kube-runtime-lease-examples --example controller
target_dir="$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')"
bin="$target_dir/$([ "$profile" = dev ] && echo debug || echo "$profile")/examples/controller"
[ -x "$bin" ] || die "$bin not found after the build"

step "scripts/cluster.sh up"
trap finish EXIT
scripts/cluster.sh up >/dev/null
eval "$(scripts/cluster.sh env)"
state="$(dirname "$KUBECONFIG")"

step "image $image from $bin (scripts/oci-image.py), imported into containerd"
python3 scripts/oci-image.py --binary "$bin" --path /controller --name "$image" --output "$state/controller-image.tar"
scripts/cluster.sh import "$state/controller-image.tar" 2>/dev/null

# deploy/'s own manifests (deploy/kustomization.yaml: RBAC, the Deployment,
# the PDB), through a kustomize overlay: the namespace, the image built here,
# 2 replicas, imagePullPolicy Never, and NO_COLOR for the log checks below.
step "deploy/ (kubectl apply -k, an overlay: namespace $ns, image $image, 2 replicas)"
overlay="$state/smoke-kustomize"
mkdir -p "$overlay"
cat >"$overlay/kustomization.yaml" <<YAML
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
namespace: $ns
resources:
  - $(python3 -c 'import os, sys; print(os.path.relpath(sys.argv[1], sys.argv[2]))' "$root/deploy" "$overlay")
images:
  - { name: configmap-controller, newName: ${image%:*}, newTag: ${image##*:} }
replicas:
  - { name: $app, count: 2 }
patches:
  - target: { kind: Deployment, name: $app }
    patch: |-
      - { op: add, path: /spec/template/spec/containers/0/imagePullPolicy, value: Never }
      - { op: add, path: /spec/template/spec/containers/0/env/-, value: { name: NO_COLOR, value: "1" } }
YAML
kubectl create namespace "$ns" >/dev/null
kubectl apply -k "$overlay" >/dev/null
if ! kubectl -n "$ns" rollout status "deployment/$app" --timeout="${timeout_s}s" >/dev/null; then
  diagnose
  die "the Deployment did not become available within ${timeout_s}s"
fi
step "both replicas ready: $(kubectl -n "$ns" get pods -l "app=$app" -o jsonpath='{.items[*].metadata.name}')"

holder() { kubectl -n "$ns" get lease "$app" -o jsonpath='{.spec.holderIdentity}' 2>/dev/null; }
# The pod whose name starts the holder identity ("<pod>_<suffix>").
holder_pod() {
  local h p
  h="$(holder)"
  [ -n "$h" ] || return 1
  for p in $(kubectl -n "$ns" get pods -l "app=$app" -o jsonpath='{.items[*].metadata.name}'); do
    case "$h" in "${p}_"*) echo "$p"; return 0 ;; esac
  done
  return 1
}
held_by_pod() { holder_pod >/dev/null; }
# The holder pod says it leads (examples/controller.rs logs each change).
leads() {
  local p
  p="$(holder_pod)" && kubectl -n "$ns" logs "$p" 2>/dev/null | grep -qF "leadership leading=true holder=\"$(holder)\""
}

wait_for "$timeout_s" "a Lease held by one of the pods" held_by_pod
first="$(holder_pod)"
step "Lease $ns/$app held by pod $first (identity $(holder))"
# The candidate that created the Lease holds it one lease duration before it
# leads (the crate's creation hold), and does not release it before: wait.
wait_for "$timeout_s" "pod $first to lead (one lease duration after it created the Lease)" leads
step "pod $first leads"

step "deleting pod $first (SIGTERM: it releases the Lease on its way out)"
t_delete=$(now_ms)
kubectl -n "$ns" delete pod "$first" --wait=false >/dev/null
other_holds() {
  local p
  p="$(holder_pod)" && [ "$p" != "$first" ]
}
wait_for "$timeout_s" "another pod to hold the Lease" other_holds
seen=$(($(now_ms) - t_delete))
second="$(holder_pod)"
# From the deletion request to the new holder's write (its acquireTime, in
# microseconds, by the same clock): what polling with kubectl adds is left out.
acquired="$(kubectl -n "$ns" get lease "$app" -o jsonpath='{.spec.acquireTime}')"
took=$(($(date -d "$acquired" +%s%N) / 1000000 - t_delete))
step "Lease taken by pod $second $took ms after the deletion request (acquireTime $acquired; seen by polling after $seen ms; identity $(holder))"
duration_ms=$(($(kubectl -n "$ns" get lease "$app" -o jsonpath='{.spec.leaseDurationSeconds}') * 1000))
[ "$took" -lt "$duration_ms" ] || {
  diagnose
  die "the takeover took $took ms, not less than the lease duration ($duration_ms ms): the Lease expired instead of being released on SIGTERM"
}
wait_for "$timeout_s" "pod $second to lead" leads
step "pod $second leads"
transitions="$(kubectl -n "$ns" get lease "$app" -o jsonpath='{.spec.leaseTransitions}')"
step "leaseTransitions: $transitions"
if ! kubectl -n "$ns" rollout status "deployment/$app" --timeout="${timeout_s}s" >/dev/null; then
  diagnose
  die "the replacement pod did not become ready within ${timeout_s}s"
fi
step "the replacement is ready; both replicas run again"
}
main "$@"; exit "$?"
