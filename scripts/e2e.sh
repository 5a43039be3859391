#!/usr/bin/env bash
# End-to-end tests of the operator example's Helm chart (deploy/chart/).
#
# usage: scripts/e2e.sh chart      the chart's tests (tests/tests/chart.rs):
#                                  helm lint, helm template for several value
#                                  sets (grace >= the library's shutdown
#                                  budget, RBAC, security context, webhook,
#                                  certificate), a server-side dry run against
#                                  the test control plane. Needs helm:
#                                  scripts/cluster.sh helm builds it (7 min on
#                                  a cold Go cache), so it is not part of
#                                  scripts/test.sh.
set -euo pipefail
main() {

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
what="${1:-chart}"
case "$what" in
  chart) ;;
  *) echo "usage: scripts/e2e.sh chart" >&2; exit 2 ;;
esac

if [ "$what" = chart ]; then
  local t=$SECONDS
  echo "e2e.sh: helm: $(scripts/cluster.sh helm)" >&2
  nice -n 10 cargo test --locked -p kube-runtime-lease-tests --test chart -- --ignored
  echo "e2e.sh: chart tests passed in $((SECONDS - t)) s" >&2
fi
}
main "$@"; exit "$?"
