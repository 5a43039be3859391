#!/usr/bin/env bash
# The project's test command (README, CI): everything that must pass.
#   1. build (or reuse) the test control plane: etcd + kube-apiserver from Go
#      modules, and helm (the Helm chart's tests, tests/tests/chart.rs)
#   2. cargo fmt --check, and the imports in the shape kube-rs's nightly
#      rustfmt options make (scripts/upstream_imports.py)
#   3. cargo clippy on every target, warnings denied; cargo check of each extra
#      alone on the core
#   4. the core alone (the library with its extras off): its unit tests
#   5. every test: unit tests (in-memory Lease API double, paused time), the
#      deterministic simulation, doc tests, and the integration tests against
#      the real apiserver (API behaviour, cross-process failover, client-go,
#      and a short chaos run on an HA control plane: tests/tests/chaos.rs)
#   6. rustdoc with warnings denied
#   7. the upstream patch series (upstream/patches/): not stale, and applied to
#      kube-rs 5.0.0 from the registry, each patch built, linted and tested.
#      Its builds are CPU work and the real-apiserver tests of step 5 mostly
#      wait on lease timings, so it runs in the background (nice 19, its own
#      log) from step 3 on; its log is printed, and its result checked, after
#      step 6.
#   8. cargo deny (advisories, bans, licenses, sources; advisories from the
#      offline RustSec snapshot in ../shared/advisory-db when present, else
#      fetched by cargo-deny: see scripts/deny.sh)
#   9. the failover test on a real single-node cluster (scripts/e2e.sh
#      failover, root: docs/real-cluster.md): the operator example's debug
#      build from step 5 (no release build) installed by its Helm chart,
#      failed over under webhook load; the cluster torn down and the host
#      checked to be as before. The cluster's Go programs (kubelet,
#      containerd, ...) build in the background from step 1 on (nice 19).
#      About 2.7 min warm; ~10 min more of Go builds cold (in the background).
#      Then the cluster demo (scripts/demo.sh --cluster) as a smoke test,
#      about 1 min. KRL_TEST_NO_CLUSTER=1 skips both (not root, or no
#      cluster wanted).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
started=$SECONDS
# Each step with the time elapsed since the start (also in the background
# job's log, a shell of its own), to see where CI's time goes.
started_at=$(date +%s)
step() { printf '\n==> [%d s] %s\n' "$(($(date +%s) - started_at))" "$*" >&2; }

step "control plane (kube-apiserver + etcd from Go modules; cached after the first build)"
scripts/control-plane.sh build >/dev/null
step "helm, for the chart's tests (from its Go module; cached after the first build)"
scripts/cluster.sh helm >/dev/null

# The real cluster (step 9): its Go builds start now, in the background and
# niced, beside the Rust steps; step 9 waits for them. Whatever happens, the
# build is stopped and the cluster torn down on the way out.
cluster=1
[ "${KRL_TEST_NO_CLUSTER:-0}" != 1 ] || cluster=0
[ "$cluster" = 0 ] || [ "$(id -u)" = 0 ] ||
  { echo "scripts/test.sh: the failover test on the real cluster needs root (KRL_TEST_NO_CLUSTER=1 skips it)" >&2; exit 1; }
cluster_build_pid=""
cluster_build_log="${TMPDIR:-/tmp}/krl-test-cluster-build.$$.log"
upstream_pid=""
upstream_log="${TMPDIR:-/tmp}/krl-test-upstream.$$.log"
e2e_started=0
cleanup() {
  local rc=$?
  trap - EXIT
  if [ -n "$cluster_build_pid" ] && kill -0 "$cluster_build_pid" 2>/dev/null; then
    kill -- "-$cluster_build_pid" 2>/dev/null || true
    wait "$cluster_build_pid" 2>/dev/null || true
  fi
  if [ -n "$upstream_pid" ] && kill -0 "$upstream_pid" 2>/dev/null; then
    kill -- "-$upstream_pid" 2>/dev/null || true
    wait "$upstream_pid" 2>/dev/null || true
  fi
  rm -f "$cluster_build_log" "$upstream_log"
  # e2e.sh tears its cluster down itself, also when it fails; this is for
  # when it was stopped before it could.
  if [ "$e2e_started" = 1 ] && [ "${KRL_E2E_KEEP:-0}" != 1 ] &&
    [ -e "${KRL_CLUSTER_DIR:-/tmp/krl-cluster}/.krl-cluster" ]; then
    echo "scripts/test.sh: tearing the cluster down" >&2
    scripts/cluster.sh down >&2 || rc=1
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
if [ "$cluster" = 1 ]; then
  step "the real cluster's programs (scripts/cluster.sh build: kubelet, containerd, ...), in the background (nice 19)"
  # Its own process group (setsid), stopped as a whole by cleanup.
  setsid nice -n 19 scripts/cluster.sh build >"$cluster_build_log" 2>&1 &
  cluster_build_pid=$!
fi

step "cargo fmt --check"
cargo fmt --all -- --check
cargo fmt --manifest-path upstream/gen/Cargo.toml -- --check
step "the imports' shape of kube-rs's nightly rustfmt (imports_granularity = \"Crate\"; std, external, crate groups)"
python3 scripts/upstream_imports.py check kube-runtime-lease/src

# Step 7 (the upstream series) in the background: its own process group,
# stopped as a whole by cleanup; its steps print their own headings.
upstream() {
  step "clippy and the tests of the series' generator (upstream/gen, -D warnings)"
  cargo clippy --manifest-path upstream/gen/Cargo.toml --locked --all-targets -- -D warnings
  cargo test --manifest-path upstream/gen/Cargo.toml --locked
  step "the upstream series: applies to kube-rs 5.0.0, builds, tests, lints, not stale (scripts/upstream.sh check)"
  scripts/upstream.sh check
  step "the kube-rs website patch applies; the kube example builds and lints (scripts/upstream.sh check-docs)"
  scripts/upstream.sh check-docs
  step "pull request 1, then each follow-up in turn, and the distance to the end state (scripts/upstream.sh check-prs)"
  scripts/upstream.sh check-prs
  step "the upstream series: passed"
}
export -f step upstream
export started_at
step "the upstream series (step 7), in the background (nice 19): its log is printed after rustdoc"
setsid nice -n 19 bash -c 'set -euo pipefail; upstream' >"$upstream_log" 2>&1 &
upstream_pid=$!

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
step "the library with every extra on the earliest Kubernetes version kube supports (k8s-openapi/earliest: the library picks none)"
cargo check -q -p kube-runtime-lease --lib --locked \
  --features "k8s-openapi/earliest,coordinated,events,lease-metadata,metrics,warm-standby,unstable-shards,test-util"

step "the core alone: its unit tests with the extras off (--no-default-features)"
cargo test -p kube-runtime-lease --no-default-features --lib --locked

step "cargo test (unit, simulation, doc, integration against the real apiserver)"
cargo test --workspace --all-features --locked

step "rustdoc (-D warnings)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --all-features --locked
step "rustdoc of the core alone (-D warnings: no link into an extra)"
RUSTDOCFLAGS="-D warnings" cargo doc -p kube-runtime-lease --no-deps --no-default-features \
  --features k8s-openapi/latest --locked
step "rustdoc of each extra alone on the core, and of each optional one beside the defaults (-D warnings: no link into an extra it does not enable)"
for feature in coordinated events lease-metadata metrics warm-standby unstable-shards test-util; do
  RUSTDOCFLAGS="-D warnings" cargo doc -q -p kube-runtime-lease --no-deps --no-default-features \
    --features "k8s-openapi/latest,$feature" --locked
done
for feature in metrics unstable-shards test-util; do
  RUSTDOCFLAGS="-D warnings" cargo doc -q -p kube-runtime-lease --no-deps \
    --features "k8s-openapi/latest,$feature" --locked
done

step "the upstream series (step 7, in the background since step 3): waiting"
if ! wait "$upstream_pid"; then
  upstream_pid=""
  cat "$upstream_log" >&2
  echo "scripts/test.sh: the upstream series' checks failed (the log above)" >&2
  exit 1
fi
upstream_pid=""
cat "$upstream_log" >&2

step "cargo deny (advisories, bans, licenses, sources)"
scripts/deny.sh

if [ "$cluster" = 1 ]; then
  step "the real cluster's programs: waiting for the background build"
  if ! wait "$cluster_build_pid"; then
    cluster_build_pid=""
    tail -30 "$cluster_build_log" >&2
    echo "scripts/test.sh: scripts/cluster.sh build failed" >&2
    exit 1
  fi
  cluster_build_pid=""
  grep -E 'built|installing|everything in place' "$cluster_build_log" >&2 || true
  step "the failover test on the real cluster (scripts/e2e.sh failover, the debug build)"
  e2e_started=1
  KRL_E2E_PROFILE=dev scripts/e2e.sh failover
  step "the cluster demo, as a smoke test (scripts/demo.sh --cluster, the debug build; about 1 min)"
  KRL_DEMO_PROFILE=dev scripts/demo.sh --cluster
else
  step "the failover test on the real cluster: skipped (KRL_TEST_NO_CLUSTER=1)"
fi

step "all checks passed in $((SECONDS - started)) s"
