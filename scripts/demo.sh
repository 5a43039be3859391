#!/usr/bin/env bash
# The failover demo (README's main job): several replicas of the example
# controller on one Lease, against a local control plane built from Go modules
# (or the cluster in KUBECONFIG, when set), showing who leads and when
# leadership moves after a crash (SIGKILL) and a graceful handover (SIGTERM).
#
# usage: scripts/demo.sh             the demo above
#        scripts/demo.sh --cluster   (root) the same story on a real
#                                    single-node cluster (scripts/cluster.sh
#                                    up): the operator example installed by its
#                                    Helm chart (3 replicas), webhook requests
#                                    through its Service and ConfigMap writes
#                                    without pause (scripts/e2e_load.py); a
#                                    timeline of who leads, a `kubectl rollout
#                                    restart`, the pods coming and going, the
#                                    new leader, and the webhook's requests and
#                                    failures during it; then down (the host
#                                    restored). About 1 min with the builds
#                                    cached (see docs/real-cluster.md).
#
# Environment (--cluster): KRL_DEMO_PROFILE (cargo profile of the operator,
# default dev), KRL_DEMO_KEEP=1 (leave the cluster up), KRL_DEMO_TIMEOUT
# (seconds for each wait, default 120), and those of scripts/cluster.sh.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

# ---------------------------------------------------------------- --cluster
script=demo.sh
ns=krl-demo
release=demo

cluster_finish() {
  local rc=$?
  trap - EXIT
  if ! operator_finish "${KRL_DEMO_KEEP:-0}" "$rc"; then
    [ "$rc" != 0 ] || rc=1
  fi
  exit "$rc"
}

# A line of the timeline: seconds since the demo began, as the other demo.
say() { printf '[%7.2fs] %s\n' "$(since "$demo_t0")" "$*"; }
# Seconds since an epoch time (date +%s.%N).
since() { awk -v now="$(date +%s.%N)" -v t="$1" 'BEGIN { printf "%.3f", now - t }'; }

# A pod's name without the Deployment's: "<template hash>-<suffix>".
short() { echo "${1#"$deploy"-}"; }
# The release's pods, one "<short name>=<state>" a line, sorted; the state is
# Terminating, Ready, Running (not ready) or the phase.
pod_states() {
  kc get pods -l "$selector" -o json 2>/dev/null | python3 -c '
import json, sys
prefix = sys.argv[1] + "-"
for p in sorted(json.load(sys.stdin)["items"], key=lambda p: p["metadata"]["name"]):
    name = p["metadata"]["name"]
    name = name[len(prefix):] if name.startswith(prefix) else name
    if p["metadata"].get("deletionTimestamp"):
        state = "Terminating"
    elif any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", [])):
        state = "Ready"
    else:
        state = p["status"].get("phase", "?")
    print(f"{name}={state}")
' "$deploy"
}

# Counters since a baseline: "N ok, F failed" for the webhook and the writes.
load_since() {
  local -a b n
  read -r -a b <<<"$1"
  read -r -a n <<<"$(counters)"
  echo "webhook $((n[0] - b[0])) requests, $((n[1] - b[1])) failed; ConfigMap writes $((n[2] - b[2])), $((n[3] - b[3])) failed"
}

cluster_demo() {
  [ "$(id -u)" = 0 ] || die "--cluster needs root (scripts/cluster.sh up runs kubelet and containerd)"
  timeout_s="${KRL_DEMO_TIMEOUT:-120}"
  # step, die, now_ms, wait_for, diagnose; then the operator on the cluster.
  # shellcheck source=scripts/lib/cluster-test.sh
  . "$root/scripts/lib/cluster-test.sh"
  # shellcheck source=scripts/lib/operator.sh
  . "$root/scripts/lib/operator.sh"
  operator_build "${KRL_DEMO_PROFILE:-dev}"
  trap cluster_finish EXIT
  operator_up
  operator_install 3
  operator_start_load
  # The first holder leads one lease duration after it created the Lease.
  wait_for "$timeout_s" "a replica to hold the Lease" held_by_current
  wait_for "$timeout_s" "the leader gauge to sum to 1" gauge_sum_is_one
  step "setup done; the timeline:"
  echo

  demo_t0="$(date +%s.%N)"
  say "3 replicas of the operator (helm install $release deploy/chart; pods $deploy-...): $(pod_states | tr '\n' ' ')"
  say "LEADER: $(short "$(holder_pod)") (leader_election_is_leader 1 on it, 0 on the others)"
  local base
  base="$(counters)"
  sleep 3
  say "steady state, 3 s: $(load_since "$base")"

  base="$(counters)"
  local leader last_holder h states last_states line name started rollout=""
  leader="$(holder_pod)"
  last_holder="$(holder)"
  last_states="$(pod_states)"
  say "kubectl rollout restart deployment/$deploy: a new pod at a time, then an old one gets SIGTERM"
  started="$(date +%s.%N)"
  kc rollout restart "deployment/$deploy" >/dev/null
  kc rollout status "deployment/$deploy" --timeout="${timeout_s}s" >"$work/demo-rollout.log" 2>&1 &
  rollout=$!
  # Until the rollout is done, the old pods are gone, and a new one leads.
  local deadline=$((SECONDS + 2 * timeout_s))
  while kill -0 "$rollout" 2>/dev/null || ! none_terminating || ! held_by_current; do
    [ "$SECONDS" -lt "$deadline" ] || { diagnose; die "the rollout did not settle within $((2 * timeout_s))s"; }
    h="$(holder || true)"
    if [ "$h" != "$last_holder" ]; then
      if [ -z "$h" ]; then
        say "Lease: released by $(short "${last_holder%_*}") (SIGTERM: it stopped reconciling first)"
      else
        say "LEADER: $(short "$(holder_pod || echo "$h")"), $(since "$started" | awk '{ printf "%d", $1 * 1000 }') ms after the restart began"
      fi
      last_holder="$h"
    fi
    states="$(pod_states)"
    if [ "$states" != "$last_states" ]; then
      while IFS= read -r line; do
        [ -n "$line" ] || continue
        grep -qxF "$line" <<<"$last_states" && continue
        name="${line%=*}"
        case "${line#*=}" in
          Terminating) say "  pod $name: SIGTERM (/readyz 503; releases the Lease if it leads; serves the webhook 5 s more, then drains)" ;;
          Ready) say "  pod $name: ready" ;;
          *) grep -q "^$name=" <<<"$last_states" || say "  pod $name: created (${line#*=})" ;;
        esac
      done <<<"$states"
      while IFS= read -r line; do
        [ -n "$line" ] || continue
        grep -q "^${line%=*}=" <<<"$states" || say "  pod ${line%=*}: gone"
      done <<<"$last_states"
      last_states="$states"
    fi
    sleep 0.2
  done
  wait "$rollout" || { cat "$work/demo-rollout.log" >&2; diagnose; die "the rollout did not finish"; }
  wait_for "$timeout_s" "the leader gauge to sum to 1" gauge_sum_is_one
  sleep 1 # the load's counters are written every 0.2 s
  say "rollout done: $(pod_states | tr '\n' ' ')"
  say "LEADER: $(short "$(holder_pod)") (was $(short "$leader")); the leader gauge sums to 1 over the new pods"
  local result
  result="$(load_since "$base")"
  say "during the rollout: $result"
  echo
  case "$result" in
    *", 0 failed; "*", 0 failed") step "no webhook request and no ConfigMap write failed during the rollout" ;;
    *) step "some requests failed: $work/failures.log"; tail -5 "$work/failures.log" >&2 || true; false ;;
  esac
}

if [ "${1:-}" = --cluster ]; then
  cluster_demo
  exit 0
fi
[ $# = 0 ] || { echo "usage: scripts/demo.sh [--cluster]" >&2; exit 2; }

if [ -n "${KUBECONFIG:-}" ]; then
    export KRL_TEST_KUBECONFIG="$KUBECONFIG"
else
    echo "==> building the local control plane (cached after the first build, ~11 min cold)" >&2
    scripts/control-plane.sh build >/dev/null
fi
exec cargo run --quiet --locked -p kube-runtime-lease-demo --bin failover-demo
