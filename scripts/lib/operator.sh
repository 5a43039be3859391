# shellcheck shell=bash disable=SC2154 # ns, release, timeout_s, work: set by the sourcing script
# Sourced (after scripts/lib/cluster-test.sh) by scripts/e2e.sh failover and
# scripts/demo.sh --cluster: the operator example (examples/operator.rs) on
# the real single-node cluster, installed by its Helm chart (deploy/chart/),
# with webhook requests and ConfigMap writes without pause
# (scripts/e2e_load.py); and what both ask the cluster about it.
#
# The sourcing script runs from the workspace root, sets `ns`, `release` and
# `timeout_s` (seconds for each wait; `release` before sourcing), and calls,
# in order: operator_build PROFILE, then (after `trap ... EXIT`
# with operator_finish in it) operator_up, operator_install REPLICAS,
# operator_start_load. Variables set on the way: bin, work, deploy, lease,
# svc, ip, pids.

image_repo=krl.local/operator
image_tag=e2e
selector="app.kubernetes.io/instance=$release"
pids=()

# operator_build PROFILE: the example built with cargo (nice); sets `bin`.
# The same package selection and features as scripts/test.sh's `cargo test
# --workspace --all-features`, so that after it the dev build is fresh.
operator_build() {
  local profile="$1" target_dir
  step "building the operator example (cargo build --profile $profile, nice)"
  nice -n 10 cargo build --quiet --locked --profile "$profile" --workspace --all-features --example operator
  target_dir="$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')"
  bin="$target_dir/$([ "$profile" = dev ] && echo debug || echo "$profile")/examples/operator"
  [ -x "$bin" ] || die "$bin not found after the build"
}

# scripts/cluster.sh up; KUBECONFIG and PATH from it; `work` in its state dir.
operator_up() {
  step "scripts/cluster.sh up"
  scripts/cluster.sh up >/dev/null
  eval "$(scripts/cluster.sh env)"
  # In the cluster's logs directory, which `down` keeps (until the next up).
  work="$(dirname "$KUBECONFIG")/logs/e2e"
  mkdir -p "$work"
}

# operator_install REPLICAS: the image imported, the chart installed and
# available, its webhook answering through the Service and called by the API
# server; the ConfigMaps `churn` and `probe`, labelled for the controllers.
operator_install() {
  local replicas="$1"
  step "image $image_repo:$image_tag (scripts/oci-image.py), imported"
  python3 scripts/oci-image.py --binary "$bin" --path /operator --name "$image_repo:$image_tag" --output "$work/operator.tar"
  scripts/cluster.sh import "$work/operator.tar" 2>/dev/null
  rm -f "$work/operator.tar"

  step "helm install $release deploy/chart in $ns ($replicas replicas)"
  kubectl create namespace "$ns" >/dev/null
  helm install "$release" deploy/chart --namespace "$ns" \
    --set "replicas=$replicas,image.repository=$image_repo,image.tag=$image_tag,image.pullPolicy=Never" >/dev/null
  deploy="$(deploy_name)"
  lease="$deploy"
  if ! kc rollout status "deployment/$deploy" --timeout="${timeout_s}s" >/dev/null; then
    diagnose
    die "the Deployment did not become available within ${timeout_s}s"
  fi
  step "ready: $(kc get pods -l "$selector" -o jsonpath='{.items[*].metadata.name}')"

  svc="$(kc get svc -l "$selector" -o jsonpath='{.items[0].metadata.name}')"
  ip="$(kc get svc "$svc" -o jsonpath='{.spec.clusterIP}')"
  kc get secret "$deploy-webhook-tls" -o jsonpath='{.data.ca\.crt}' | base64 -d >"$work/ca.crt"
  # Ready pods are not yet a Service that answers: the endpoints, then
  # kube-proxy's rules (until then the ClusterIP refuses connections, and
  # the API server fails labelled writes: failurePolicy Fail).
  wait_for "$timeout_s" "the webhook's Service to answer on $ip:443" \
    curl -sf --max-time 2 --cacert "$work/ca.crt" --resolve "$svc.$ns.svc:443:$ip" "https://$svc.$ns.svc/readyz"
  kubectl create -f - >/dev/null <<YAML
apiVersion: v1
kind: ConfigMap
metadata: { name: churn, namespace: $ns, labels: { operator.example.com/managed: "true" } }
data: { n: "0" }
---
apiVersion: v1
kind: ConfigMap
metadata: { name: probe, namespace: $ns, labels: { operator.example.com/managed: "true" } }
data: { v: "0" }
YAML
  # The API server applied the webhook (failurePolicy Fail) to both.
  if kubectl create -f - >/dev/null 2>"$work/denied.txt" <<YAML; then
apiVersion: v1
kind: ConfigMap
metadata: { name: denied, namespace: $ns, labels: { operator.example.com/managed: "true" } }
data: { password: x }
YAML
    die "a labelled ConfigMap with a password key was admitted: the webhook is not called"
  fi
  grep -q "looks like a secret" "$work/denied.txt" || die "the denial does not come from the webhook: $(cat "$work/denied.txt")"
  step "the API server calls the webhook through Service $svc ($ip:443): a ConfigMap with a password key denied"
}

# kubectl proxy on KRL_CLUSTER_PORT_BASE + 801, and scripts/e2e_load.py run
# through it and to the Service's ClusterIP; both in `pids`.
operator_start_load() {
  local proxy_port=$((${KRL_CLUSTER_PORT_BASE:-17000} + 801))
  kubectl proxy --port="$proxy_port" >"$work/proxy.log" 2>&1 &
  pids+=($!)
  wait_for 30 "kubectl proxy on 127.0.0.1:$proxy_port" curl -sf "http://127.0.0.1:$proxy_port/version"
  python3 scripts/e2e_load.py run --dir "$work" --webhook "$ip:443" --server-name "$svc.$ns.svc" \
    --ca "$work/ca.crt" --proxy "$proxy_port" --namespace "$ns" --lease "$lease" --configmap churn &
  pids+=($!)
  step "load: webhook reviews to $ip:443 (the Service's ClusterIP, from the host: kube-proxy's DNAT) without pause, ConfigMap churn every 0.25 s"
}

# operator_finish KEEP RC: the load and the proxy stopped (by their PIDs);
# when RC is not 0, every pod's log (those of deleted pods too) copied next
# to the load's files; then, unless KEEP is 1, scripts/cluster.sh down.
# Returns 1 when down failed (the host differs).
operator_finish() {
  local keep="$1" rc="$2" p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  pids=()
  if [ "$rc" != 0 ] && [ -n "${work:-}" ] && [ -d "$(dirname "$(dirname "$work")")/pod-logs" ]; then
    cp -r "$(dirname "$(dirname "$work")")/pod-logs" "$work/" 2>/dev/null || true
    step "the pods' logs and the load's files: $work"
  fi
  if [ "$keep" = 1 ]; then
    step "left the cluster up: scripts/cluster.sh down stops it"
    return 0
  fi
  step "down"
  scripts/cluster.sh down >/dev/null
}

# ------------------------------------------------------------------ queries
kc() { kubectl -n "$ns" "$@"; }
deploy_name() { kc get deploy -l "$selector" -o jsonpath='{.items[0].metadata.name}'; }
holder() { kc get lease "$lease" -o jsonpath='{.spec.holderIdentity}' 2>/dev/null; }
# The pod whose name starts the holder identity ("<pod>_<suffix>").
holder_pod() {
  local h p
  h="$(holder)"
  [ -n "$h" ] || return 1
  for p in $(kc get pods -l "$selector" -o jsonpath='{.items[*].metadata.name}'); do
    case "$h" in "${p}_"*) echo "$p"; return 0 ;; esac
  done
  return 1
}
# The pod-template-hash of the Deployment's current ReplicaSet.
current_hash() {
  local rev
  rev="$(kc get deploy "$deploy" -o jsonpath='{.metadata.annotations.deployment\.kubernetes\.io/revision}')"
  kc get rs -l "$selector" -o json | python3 -c '
import json, sys
rev = sys.argv[1]
for rs in json.load(sys.stdin)["items"]:
    if rs["metadata"].get("annotations", {}).get("deployment.kubernetes.io/revision") == rev:
        print(rs["metadata"]["labels"]["pod-template-hash"])
' "$rev"
}
held_by_current() {
  local p hash
  p="$(holder_pod)" || return 1
  hash="$(current_hash)"
  [ -n "$hash" ] && [ "$(kc get pod "$p" -o jsonpath='{.metadata.labels.pod-template-hash}')" = "$hash" ]
}
# Running pods not being deleted.
live_pods() {
  kc get pods -l "$selector" -o json | python3 -c '
import json, sys
for p in json.load(sys.stdin)["items"]:
    if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp"):
        print(p["metadata"]["name"])
'
}
# leader_election_is_leader of a pod, through the API server's pod proxy.
gauge() {
  kubectl get --raw "/api/v1/namespaces/$ns/pods/https:$1:9443/proxy/metrics" |
    awk '$1 ~ /^leader_election_is_leader({.*})?$/ {s += $2; n++} END {if (!n) exit 1; print s + 0}'
}
gauge_sum_is_one() {
  local p v sum=0
  for p in $(live_pods); do
    v="$(gauge "$p")" || return 1
    sum=$((sum + v))
  done
  [ "$sum" = 1 ]
}
none_terminating() {
  [ -z "$(kc get pods -l "$selector" -o jsonpath='{.items[?(@.metadata.deletionTimestamp)].metadata.name}')" ]
}
# The load's counters: webhook_ok webhook_fail churn_ok churn_fail.
counters() { python3 scripts/e2e_load.py counters --dir "$work"; }
