#!/usr/bin/env bash
# End-to-end tests of the operator example's Helm chart (deploy/chart/).
#
# usage: scripts/e2e.sh chart      the chart's tests (tests/tests/chart.rs):
#                                  helm lint, helm template for several value
#                                  sets (grace >= the library's shutdown
#                                  budget, RBAC, security context, webhook,
#                                  certificate), a server-side dry run against
#                                  the test control plane (also part of
#                                  scripts/test.sh's cargo test). Needs helm:
#                                  scripts/cluster.sh helm builds it (7 min on
#                                  a cold Go cache, cached after that).
#        scripts/e2e.sh failover   (root) on the real single-node cluster
#                                  (scripts/cluster.sh up): the operator
#                                  example built (KRL_E2E_PROFILE), its image
#                                  imported, the chart installed; then, with
#                                  webhook requests through the Service
#                                  without pause and a labelled ConfigMap
#                                  changing every 0.25 s (scripts/e2e_load.py):
#                                  two rollout restarts, a helm upgrade
#                                  (the certificate kept), the leader's pod
#                                  deleted, a drain of the node (the PDB keeps
#                                  the last replica), the Lease taken over by
#                                  another identity. After each: one replica
#                                  of the current ReplicaSet holds the Lease,
#                                  the leader gauge sums to 1 over the pods, a
#                                  change is reconciled within a bound, and no
#                                  webhook request failed. down at the end,
#                                  also on failure.
#
# Environment (failover):
#   KRL_E2E_KEEP=1            leave the cluster up at the end (and on failure)
#   KRL_E2E_TIMEOUT           seconds for each wait (default 120)
#   KRL_E2E_REPLICAS          replicas (default 3)
#   KRL_E2E_RECONCILE_BOUND   seconds within which a change made after an
#                             event is reconciled (default 10)
#   KRL_E2E_PROFILE           cargo profile of the operator (default release;
#                             scripts/test.sh passes dev: the debug build its
#                             cargo test already made, no release build)
#   and those of scripts/cluster.sh (KRL_CLUSTER_DIR, KRL_CLUSTER_PORT_BASE).
set -euo pipefail
# All of it in functions, read whole before it runs.

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
script=e2e.sh
ns=krl-e2e
release=op
# step, die, now_ms, wait_for, diagnose
# shellcheck source=scripts/lib/cluster-test.sh
. "$root/scripts/lib/cluster-test.sh"
# operator_build, operator_up, operator_install, operator_start_load,
# operator_finish, and the queries (holder_pod, held_by_current, gauge, ...)
# shellcheck source=scripts/lib/operator.sh
. "$root/scripts/lib/operator.sh"

chart_tests() {
  local t=$SECONDS
  step "helm: $(scripts/cluster.sh helm)"
  nice -n 10 cargo test --locked -p kube-runtime-lease-tests --test chart
  step "chart tests passed in $((SECONDS - t)) s"
}

# ------------------------------------------------------------------ failover
finish() {
  local rc=$?
  trap - EXIT
  if ! operator_finish "${KRL_E2E_KEEP:-0}" "$rc"; then
    [ "$rc" != 0 ] || rc=1
  fi
  if [ "$rc" = 0 ]; then step "failover test passed in $((SECONDS - t0)) s"; else step "failover test FAILED (exit $rc)"; fi
  exit "$rc"
}

former=""
held_by_another() { local p; p="$(holder_pod)" && [ "$p" != "$former" ]; }
former_not_leading() { [ "$(gauge "$former")" = 0 ]; }
annotation() { kc get cm probe -o jsonpath="{.metadata.annotations.operator\.example\.com/$1}"; }

# A change of the probe ConfigMap, reconciled (its checksum annotation moves)
# by the holder, within the bound: prints the time in ms.
check_reconciled() {
  local before start
  before="$(annotation checksum)"
  start=$(now_ms)
  kc patch cm probe --type merge -p "{\"data\":{\"v\":\"$1-$start\"}}" >/dev/null
  local deadline=$((start + bound * 1000))
  until [ "$(annotation checksum)" != "$before" ]; do
    [ "$(now_ms)" -lt "$deadline" ] || { diagnose; die "$1: a change was not reconciled within ${bound}s"; }
    sleep 0.1
  done
  local took=$(($(now_ms) - start)) by
  by="$(annotation reconciled-by)"
  [ "$by" = "$(holder)" ] || die "$1: reconciled by $by, not by the holder $(holder)"
  echo "$took"
}

results=()
failures=0
# after_event NAME START_EPOCH COUNTERS_BEFORE: the checks, and a row.
after_event() {
  local name="$1" since="$2" before="$3"
  # The old pods' SIGTERM sequences (drain delay, drain) count in this event.
  wait_for "$timeout_s" "$name: the pods being deleted to be gone" none_terminating
  wait_for "$timeout_s" "$name: the Lease held by a pod of the current ReplicaSet" held_by_current
  wait_for "$timeout_s" "$name: the leader gauge to sum to 1 over the pods" gauge_sum_is_one
  local reconcile after gaps leaderless changes wok wfail cok cfail
  reconcile="$(check_reconciled "$name")"
  sleep 1 # the load's counters are written every 0.2 s
  after="$(counters)"
  read -r wok wfail cok cfail <<<"$after"
  local -a b
  read -r -a b <<<"$before"
  wok=$((wok - b[0])) wfail=$((wfail - b[1])) cok=$((cok - b[2])) cfail=$((cfail - b[3]))
  gaps="$(python3 scripts/e2e_load.py leaderless --dir "$work" --since "$since")"
  leaderless="$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["leaderless_ms"])' "$gaps")"
  changes="$(python3 -c 'import json,sys; print(len(json.loads(sys.argv[1])["changes"]))' "$gaps")"
  settled="$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["settled_ms"])' "$gaps")"
  step "$name: holder $(holder_pod), its term began ${settled} ms after the event began; longest time without a replica holding the Lease ${leaderless} ms ($changes holder changes, releases included); change reconciled in ${reconcile} ms; webhook ${wok} ok ${wfail} failed; ConfigMap writes ${cok} ok ${cfail} failed"
  results+=("| $name | $settled | $leaderless | $changes | $reconcile | $wok | $wfail | $cok | $cfail |")
  if [ "$wfail" != 0 ] || [ "$cfail" != 0 ]; then
    failures=$((failures + 1))
    step "$name: FAILED requests (see $work/failures.log):"
    tail -5 "$work/failures.log" >&2 || true
  fi
}

failover() {
  [ "$(id -u)" = 0 ] || die "needs root (scripts/cluster.sh up runs kubelet and containerd)"
  timeout_s="${KRL_E2E_TIMEOUT:-120}"
  replicas="${KRL_E2E_REPLICAS:-3}"
  bound="${KRL_E2E_RECONCILE_BOUND:-10}"
  operator_build "${KRL_E2E_PROFILE:-release}"
  trap finish EXIT
  operator_up
  operator_install "$replicas"
  operator_start_load

  # The first holder leads one lease duration after it created the Lease.
  wait_for "$timeout_s" "the Lease held by a pod of the current ReplicaSet" held_by_current
  wait_for "$timeout_s" "the leader gauge to sum to 1" gauge_sum_is_one
  check_reconciled initial >/dev/null
  local since before
  since="$(date +%s.%N)"
  before="$(counters)"
  sleep 3
  after_event "steady state (3 s)" "$since" "$before"

  local i
  for i in 1 2; do
    since="$(date +%s.%N)"
    before="$(counters)"
    kc rollout restart "deployment/$deploy" >/dev/null
    kc rollout status "deployment/$deploy" --timeout="${timeout_s}s" >/dev/null || { diagnose; die "rollout restart $i did not finish"; }
    after_event "rollout restart $i" "$since" "$before"
  done

  # helm upgrade with a new value: a new pod template (a rollout), and the
  # generated certificate kept (the chart looks the Secret up).
  local ca_before
  ca_before="$(kc get secret "$deploy-webhook-tls" -o jsonpath='{.data.ca\.crt}')"
  since="$(date +%s.%N)"
  before="$(counters)"
  helm upgrade "$release" deploy/chart --namespace "$ns" --reuse-values --set shutdownGrace=25 >/dev/null
  kc rollout status "deployment/$deploy" --timeout="${timeout_s}s" >/dev/null || { diagnose; die "the helm upgrade's rollout did not finish"; }
  [ "$(kc get secret "$deploy-webhook-tls" -o jsonpath='{.data.ca\.crt}')" = "$ca_before" ] ||
    die "helm upgrade replaced the webhook's CA"
  [ "$(kubectl get validatingwebhookconfiguration -l "$selector" -o jsonpath='{.items[0].webhooks[0].clientConfig.caBundle}')" = "$ca_before" ] ||
    die "helm upgrade changed the webhook's caBundle"
  [ "$(kc get deploy "$deploy" -o jsonpath='{.spec.template.spec.terminationGracePeriodSeconds}')" = 62 ] ||
    die "terminationGracePeriodSeconds is not 62 (shutdown_budget(25 s) = 52 s, + 10 s) after the upgrade"
  after_event "helm upgrade (shutdownGrace 25)" "$since" "$before"

  local leader
  leader="$(holder_pod)"
  since="$(date +%s.%N)"
  before="$(counters)"
  kc delete pod "$leader" --wait=false >/dev/null
  former="$leader"
  wait_for "$timeout_s" "another pod to hold the Lease" held_by_another
  kc rollout status "deployment/$deploy" --timeout="${timeout_s}s" >/dev/null || { diagnose; die "the deleted leader was not replaced"; }
  after_event "leader pod deleted" "$since" "$before"

  drain_node "$(kubectl get nodes -o jsonpath='{.items[0].metadata.name}')"
  takeover

  step "results:"
  {
    echo "| event | final holder's term began (ms after the event) | longest without a replica holding the Lease (ms) | holder changes | change reconciled (ms) | webhook ok | webhook failed | ConfigMap writes ok | failed |"
    echo "|---|---|---|---|---|---|---|---|---|"
    printf '%s\n' "${results[@]}"
  } | tee "$work/results.md" >&2
  [ "$failures" = 0 ] || die "requests failed during $failures event(s): $work/failures.log"
}

# kubectl drain of the single node: the PDB (minAvailable 1) lets all but one
# replica be evicted; their replacements cannot be scheduled (the node is
# cordoned, and there is no other), and the eviction of the last replica is
# refused for as long as the drain tries. Asserted: the drain does not
# complete; one replica runs, ready, holding the Lease; the others are
# Pending; then uncordon, and all replicas run again.
drain_node() {
  local node="$1" since before rc=0
  since="$(date +%s.%N)"
  before="$(counters)"
  step "kubectl drain $node (30 s): the PDB must keep one replica"
  kubectl drain "$node" --ignore-daemonsets --delete-emptydir-data --timeout=30s >"$work/drain.log" 2>&1 || rc=$?
  [ "$rc" != 0 ] || { cat "$work/drain.log" >&2; die "the drain completed: the PDB did not keep the last replica"; }
  grep -q "disruption budget" "$work/drain.log" || { cat "$work/drain.log" >&2; die "the drain failed, but not on the disruption budget"; }
  local live pending
  live="$(live_pods | wc -l)"
  pending="$(kc get pods -l "$selector" --field-selector=status.phase=Pending -o name | wc -l)"
  [ "$live" = 1 ] || { diagnose; die "drain: $live replicas running, expected the 1 the PDB keeps"; }
  [ "$pending" = "$((replicas - 1))" ] || { diagnose; die "drain: $pending replicas Pending, expected $((replicas - 1))"; }
  step "drain refused on the PDB after evicting $((replicas - 1)); 1 replica runs ($(live_pods)), $pending Pending (no node to go to)"
  after_event "node drained (PDB keeps 1)" "$since" "$before"
  kubectl uncordon "$node" >/dev/null
  kc rollout status "deployment/$deploy" --timeout="${timeout_s}s" >/dev/null || { diagnose; die "the replicas did not come back after uncordon"; }
  step "uncordoned: $replicas replicas ready again"
}

# Another identity forced into the Lease: the leader loses it without a
# restart (same pod, same restartCount), stops reconciling (a change made
# while the intruder holds the Lease is not reconciled), keeps serving the
# webhook; once the intruder's Lease expires, a replica takes it.
takeover() {
  local leader restarts uid since before now transitions
  leader="$(holder_pod)"
  restarts="$(kc get pod "$leader" -o jsonpath='{.status.containerStatuses[0].restartCount}')"
  uid="$(kc get pod "$leader" -o jsonpath='{.metadata.uid}')"
  since="$(date +%s.%N)"
  before="$(counters)"
  now="$(date -u +%Y-%m-%dT%H:%M:%S.%6NZ)"
  transitions="$(kc get lease "$lease" -o jsonpath='{.spec.leaseTransitions}')"
  kc patch lease "$lease" --type merge -p "{\"spec\":{\"holderIdentity\":\"intruder\",\"acquireTime\":\"$now\",\"renewTime\":\"$now\",\"leaseDurationSeconds\":15,\"leaseTransitions\":$((transitions + 1))}}" >/dev/null
  step "Lease taken over by identity 'intruder' from $leader"
  local t_patch stopped
  t_patch=$(now_ms)
  former="$leader"
  wait_for 20 "the former leader $leader to report leader_election_is_leader 0" former_not_leading
  stopped=$(($(now_ms) - t_patch))
  [ "$(holder)" = intruder ] || die "the intruder's Lease ended before the former leader stopped leading ($stopped ms)"
  step "the former leader's gauge is 0 (seen ${stopped} ms after the takeover)"
  local checksum seen h
  checksum="$(annotation checksum)"
  kc patch cm probe --type merge -p "{\"data\":{\"v\":\"during-intruder-$(now_ms)\"}}" >/dev/null
  # The checksum read before the holder: a changed checksum with the
  # intruder still holding afterwards is a reconcile in its term.
  while :; do
    seen="$(annotation checksum)"
    h="$(holder)"
    [ "$h" = intruder ] || break
    [ "$seen" = "$checksum" ] || { diagnose; die "a change was reconciled while 'intruder' held the Lease"; }
    sleep 0.2
  done
  step "no reconcile while 'intruder' held the Lease; now held by $h"
  after_event "Lease taken over by another identity" "$since" "$before"
  [ "$(kc get pod "$leader" -o jsonpath='{.metadata.uid}')" = "$uid" ] || die "the former leader's pod was replaced"
  [ "$(kc get pod "$leader" -o jsonpath='{.status.containerStatuses[0].restartCount}')" = "$restarts" ] ||
    die "the former leader $leader restarted (restartCount $restarts -> $(kc get pod "$leader" -o jsonpath='{.status.containerStatuses[0].restartCount}'))"
  step "the former leader $leader: same pod, restartCount still $restarts"
}

main() {
  cd "$root"
  case "${1:-}" in
    chart) chart_tests ;;
    failover) failover ;;
    *) echo "usage: scripts/e2e.sh chart|failover" >&2; exit 2 ;;
  esac
}
main "$@"; exit "$?"
