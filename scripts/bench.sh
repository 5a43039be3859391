#!/usr/bin/env bash
# Benchmarks: kube-runtime-lease side by side with client-go's leaderelection
# and k8s-controller 0.15, against a real etcd + kube-apiserver. Not part of the
# test run. Results: bench/results/ (raw JSON, summary.md, failover.svg) and the
# tables of BENCHMARKS.md, regenerated in place.
#
# usage: scripts/bench.sh [--quick] [--only handover,failover,api,warm,sharded,adapter] [--trials N]
#        scripts/bench.sh --only shard-scale [--label before|after] [--cells SPEC]...
#                         [--window-fast S] [--window-default S] [--idle-window S]
#                         [--settle-timeout S] [--rebalance-timeout S] [--add]
#
#   --quick    smoke run: 3 trials per scenario and 10 s windows (a few minutes);
#              its numbers are not the ones to publish.
#   --only     a comma-separated subset of handover, failover, api, warm, sharded, adapter
#              (default: all), or shard-scale (never in the default set: it is long).
#              Only those scenarios' result files are rewritten.
#   --trials N trials per implementation and timing set for handover and failover
#              (default 20).
#
# shard-scale: elected shards over a grid of cells (replicas M, shards S, timing
# set fast = 2 s/1.5 s/0.5 s or default = 15 s/10 s/2 s), each measuring Lease
# writes/reads and watch events per replica at the apiserver, control-plane and
# replica CPU and RSS, a pass's throughput against one replica, and rebalance
# times after a join, a SIGTERM and a SIGKILL (bench/src/shard_scale.rs).
# Results: bench/results/shard_scale-<label>.json and .md (BENCHMARKS.md is
# not touched).
#   --label L      names the results (default "run"), e.g. before / after a change.
#   --add          runs the --cells into the label's existing results: cells of the
#                  same M, S and timing set are replaced, the others kept (a
#                  one-replica baseline already there is not run again).
#   --cells SPEC   repeatable; each adds the product "M=2,4,8;S=16,64,256;timings=fast"
#                  (plus the M=1 baseline of each S and timing set). Default: every
#                  cell of M=2,4,8,16 x S=16,64,256 at both timing sets (about an
#                  hour on 2 cores).
#   --window-fast S / --window-default S   the quiet window per cell (20 s / 30 s).
#   --idle-window S                        the idle window before each cell (10 s).
#   --settle-timeout S / --rebalance-timeout S   bounds of the waits for a balanced
#                  election (default: 60 s + 4 lease durations / 60 s for fast,
#                  120 s + 4 lease durations / 120 s for default); a cell past them fails.
#
# A full run takes about 50 minutes on 2 cores (most of it waiting for leases
# to expire at 15 s). Everything builds into bench/target, away from the main
# workspace's target/.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

# The command line, for the results that record it (shard-scale's meta).
export KRL_BENCH_COMMAND="scripts/bench.sh$(printf ' %q' "$@")"
quick=()
only="handover,failover,api,warm,sharded,adapter"
driver_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=(--quick); shift ;;
    --add) driver_args+=(--add); shift ;;
    --only) only="$2"; shift 2 ;;
    --trials) driver_args+=(--trials "$2"); shift 2 ;;
    --label|--cells|--window-fast|--window-default|--idle-window|--settle-timeout|--rebalance-timeout) driver_args+=("$1" "$2"); shift 2 ;;
    -h|--help) sed -n '2,43p' "$0"; exit 0 ;;
    *) echo "bench.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done

export CARGO_TARGET_DIR="$root/bench/target"
start=$(date +%s)

echo "bench.sh: building the control plane and goelect (cached after the first build)" >&2
bin_dir="$(bash scripts/control-plane.sh build | tail -1)"
export KRL_BIN_DIR="$bin_dir"

echo "bench.sh: building the candidates and the driver (release)" >&2
cargo build --release -p kube-runtime-lease-candidate --bin candidate
cargo build --release --manifest-path bench/Cargo.toml --bins

driver_only="$(echo "$only" | tr ',' '\n' | grep -v '^adapter$' | paste -sd, - || true)"
if [ -n "$driver_only" ]; then
  "$CARGO_TARGET_DIR/release/bench-driver" run "${quick[@]}" --only "$driver_only" "${driver_args[@]}"
fi

if echo "$only" | tr ',' '\n' | grep -qx adapter; then
  echo "bench.sh: adapter overhead (criterion)" >&2
  crit_args=()
  if [ ${#quick[@]} -gt 0 ]; then
    crit_args=(--warm-up-time 1 --measurement-time 2 --sample-size 10)
  fi
  # Built alone, so that the library is built without `test-util` (see
  # bench/adapter/Cargo.toml).
  (cd bench && cargo bench -p kube-runtime-lease-adapter-bench --bench adapter -- "${crit_args[@]}")
  "$CARGO_TARGET_DIR/release/bench-driver" report
fi

echo "bench.sh: done in $(( ($(date +%s) - start) / 60 )) min; see bench/results/summary.md and BENCHMARKS.md" >&2
