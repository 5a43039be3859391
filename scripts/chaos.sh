#!/usr/bin/env bash
# The chaos run: an HA control plane (3 etcd members, 2 kube-apiservers),
# kube-runtime-lease's candidates and client-go's side by side, a seeded
# schedule of faults, and the verdict on what each group's guarded work
# wrote to its ledger ConfigMap (stale writes, tokens backwards, overlaps,
# gaps). See harness/src/chaos/mod.rs.
#
# usage: scripts/chaos.sh [--minutes N | --seconds N] [--seed S] [--log-dir DIR] [--report FILE]
#
# Without --seed a random seed is drawn and printed; replay a run with it.
# Exits 1 when kube-runtime-lease's column shows a failure.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
scripts/control-plane.sh build >/dev/null
cargo build --locked -q -p kube-runtime-lease-candidate --bin candidate
exec cargo run --locked -q -p kube-runtime-lease-harness --bin chaos -- "$@"
