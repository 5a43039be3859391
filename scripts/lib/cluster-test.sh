# shellcheck shell=bash disable=SC2154 # ns, release, timeout_s, work: set by the sourcing script
# Sourced by the scripts that test on the real cluster (scripts/e2e.sh,
# scripts/cluster-smoke.sh, scripts/demo.sh --cluster): the timeline's step
# lines, failing, bounded waits and what to print when a wait times out.
#
# The sourcing script sets `script` (its name, for errors) and, before any
# wait, `ns` (the namespace diagnose shows); `work` (optional) is a directory
# whose failures.log (scripts/e2e_load.py) diagnose shows too.

t0=${t0:-$SECONDS}
# A signal ends the script through its EXIT trap (which tears the cluster
# down) with a failing status: without these, the EXIT trap of a script
# killed by SIGTERM sees the status of its last command, often 0.
trap 'exit 130' INT
trap 'exit 143' TERM
step() { printf '[%4ss] %s\n' "$((SECONDS - t0))" "$*" >&2; }
die() { echo "${script:-${0##*/}}: error: $*" >&2; exit 1; }
now_ms() { echo $(($(date +%s%N) / 1000000)); }

# wait_for SECONDS WHAT command...: polls the command until it succeeds;
# after SECONDS, diagnose and fail.
wait_for() {
  local timeout="$1" what="$2"
  shift 2
  local deadline=$((SECONDS + timeout))
  until "$@" >/dev/null 2>&1; do
    [ "$SECONDS" -lt "$deadline" ] || { diagnose; die "timed out after ${timeout}s waiting for $what"; }
    sleep 0.5
  done
}

# What is going on in $ns: pods, Leases, the last Events, the load's last
# failures, each pod's last log lines.
diagnose() {
  echo "----- pods, lease, events in $ns -----" >&2
  kubectl -n "$ns" get pods -o wide >&2 || true
  kubectl -n "$ns" get lease -o yaml >&2 || true
  kubectl -n "$ns" get events --sort-by=.lastTimestamp 2>/dev/null | tail -20 >&2 || true
  if [ -n "${work:-}" ] && [ -f "$work/failures.log" ]; then
    echo "----- last failures of the load ($work/failures.log) -----" >&2
    tail -20 "$work/failures.log" >&2 || true
  fi
  local p
  for p in $(kubectl -n "$ns" get pods -o name 2>/dev/null); do
    echo "----- logs of $p -----" >&2
    kubectl -n "$ns" logs "$p" --tail=20 >&2 || true
  done
}
