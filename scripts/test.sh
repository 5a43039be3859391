#!/usr/bin/env bash
# The project's test command (README, CI): everything that must pass.
#   1. build (or reuse) the test control plane: etcd + kube-apiserver from Go
#      modules, and helm (the Helm chart's tests, tests/tests/chart.rs)
#   2. cargo fmt --check
#   3. cargo clippy on every target, warnings denied; cargo check of each extra
#      alone on the core
#   4. the core alone (the library with its extras off): its unit tests
#   5. every test: unit tests (in-memory Lease API double, paused time), the
#      deterministic simulation, doc tests, and the integration tests against
#      the real apiserver (API behaviour, cross-process failover, client-go,
#      and a short chaos run on an HA control plane: tests/tests/chaos.rs)
#   6. rustdoc with warnings denied
#   7. the upstream patch series (upstream/patches/): not stale, and applied to
#      kube-rs 5.0.0 from the registry, each patch built, linted and tested
#   8. cargo deny (advisories, bans, licenses, sources; advisories from the
#      offline RustSec snapshot in ../shared/advisory-db when present, else
#      fetched by cargo-deny: see scripts/deny.sh)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
step() { printf '\n==> %s\n' "$*" >&2; }
started=$SECONDS

step "control plane (kube-apiserver + etcd from Go modules; cached after the first build)"
scripts/control-plane.sh build >/dev/null
step "helm, for the chart's tests (from its Go module; cached after the first build)"
scripts/cluster.sh helm >/dev/null

step "cargo fmt --check"
cargo fmt --all -- --check
cargo fmt --manifest-path upstream/gen/Cargo.toml -- --check

step "cargo clippy (all targets, all features, -D warnings)"
cargo clippy --workspace --all-targets --all-features --locked -- -D warnings
step "cargo clippy (the library with its default features, -D warnings)"
cargo clippy -p kube-runtime-lease --all-targets --locked -- -D warnings
step "cargo clippy (the core alone: the library with the extras off, -D warnings)"
cargo clippy -p kube-runtime-lease --all-targets --no-default-features --locked -- -D warnings

step "each extra alone on the core (cargo check per feature: no extra may need another it does not enable)"
for feature in coordinated events lease-metadata metrics warm-standby unstable-shards test-util; do
  cargo check -q -p kube-runtime-lease --no-default-features --features "k8s-openapi/latest,$feature" --locked
done

step "the core alone: its unit tests with the extras off (--no-default-features)"
cargo test -p kube-runtime-lease --no-default-features --lib --locked

step "cargo test (unit, simulation, doc, integration against the real apiserver)"
cargo test --workspace --all-features --locked

step "rustdoc (-D warnings)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --all-features --locked
step "rustdoc of the core alone (-D warnings: no link into an extra)"
RUSTDOCFLAGS="-D warnings" cargo doc -p kube-runtime-lease --no-deps --no-default-features \
  --features k8s-openapi/latest --locked

step "clippy of the series' generator (upstream/gen, -D warnings)"
cargo clippy --manifest-path upstream/gen/Cargo.toml --locked -- -D warnings
step "the upstream series: applies to kube-rs 5.0.0, builds, tests, lints, not stale (scripts/upstream.sh check)"
scripts/upstream.sh check

step "cargo deny (advisories, bans, licenses, sources)"
scripts/deny.sh

step "all checks passed in $((SECONDS - started)) s"
