#!/usr/bin/env bash
# The failover demo (README's main job): several replicas of the example
# controller on one Lease, against a local control plane built from Go modules
# (or the cluster in KUBECONFIG, when set), showing who leads and when
# leadership moves after a crash (SIGKILL) and a graceful handover (SIGTERM).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
if [ -n "${KUBECONFIG:-}" ]; then
    export KRL_TEST_KUBECONFIG="$KUBECONFIG"
else
    echo "==> building the local control plane (cached after the first build, ~11 min cold)" >&2
    scripts/control-plane.sh build >/dev/null
fi
exec cargo run --quiet --locked -p kube-runtime-lease-demo --bin failover-demo
