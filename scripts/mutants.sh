#!/usr/bin/env bash
# Mutation testing of the safety core: cargo-mutants (pinned, installed into the
# project's tool cache like cargo-deny) over the record logic, the guard, the
# stream adapter, the election task and the sharded election's rules and
# balancer, with the unit suite and the simulation as the test command. Slow on
# a 2-core machine (10-30 s per mutant, a few hours in all), so it is not part
# of scripts/test.sh: run it by hand, a file or folder at a time, and resume
# with --iterate (mutants already caught are skipped). docs/mutation-testing.md
# has the counts and times.
#
#   scripts/mutants.sh                      # the whole safety core, in turn
#   scripts/mutants.sh src/record.rs        # one file
#   scripts/mutants.sh src/elector          # the election task's folder
#   scripts/mutants.sh src/shard/mod.rs     # the sharded election's balancer
#   KRL_MUTANTS_JOBS=2 scripts/mutants.sh   # two mutants at a time
#   KRL_MUTANTS_ARGS="--shard 0/4" scripts/mutants.sh src/elector
#
# Results: mutants.out/<file>/ (outcomes.json, caught.txt, missed.txt, ...).
# docs/mutation-testing.md is the report: update it from missed.txt.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
# shellcheck source=scripts/lib/tools.sh
. "$root/scripts/lib/tools.sh"
mutants="$(cargo_tool cargo-mutants 27.1.0 cargo-mutants mutants)"

files=("$@")
if [ ${#files[@]} -eq 0 ]; then
    files=(src/record.rs src/term.rs src/guard.rs src/stream.rs src/stream/each_term.rs src/elector src/shard/assign.rs src/shard/mod.rs)
fi
# A shorter simulation per mutant; the full 1000 schedules run in scripts/test.sh.
# The unit suite takes ~8 s; a mutant that makes the election loop hot (a retry
# with no wait against the instant double never yields to paused time, so no
# test's paused-time bound can fire; the Lease API double aborts after its
# request budget, but a loop that makes no request spins) is cut off after
# three times the baseline's test time, at least KRL_MUTANTS_TIMEOUT s (25). (A
# fixed --timeout would also bound the baseline, which a loaded machine can
# exceed: then no mutant of that file is tested.)
export KRL_SIM_SCHEDULES="${KRL_SIM_SCHEDULES:-200}"
# And a shorter sharded simulation (60 schedules in scripts/test.sh).
export KRL_SIM_SHARDED_SCHEDULES="${KRL_SIM_SHARDED_SCHEDULES:-10}"
for file in "${files[@]}"; do
    out="mutants.out/$(basename "$file" .rs)"
    mkdir -p "$out"
    echo "mutants.sh: $file -> $out" >&2
    # shellcheck disable=SC2086 # KRL_MUTANTS_ARGS is a list of flags
    target="kube-runtime-lease/$file"
    # A folder: every file below it (its #[cfg(test)] modules are skipped).
    [ -d "$target" ] && target="$target/**/*.rs"
    "$mutants" mutants --package kube-runtime-lease --file "$target" \
        --all-features --cargo-test-arg=--lib --jobs "${KRL_MUTANTS_JOBS:-1}" \
        --timeout-multiplier 3 --minimum-test-timeout "${KRL_MUTANTS_TIMEOUT:-25}" \
        --output "$out" --iterate ${KRL_MUTANTS_ARGS:-} || true
done
echo "mutants.sh: done; missed mutants are listed in mutants.out/*/mutants.out/missed.txt" >&2
