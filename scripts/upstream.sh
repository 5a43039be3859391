#!/usr/bin/env bash
# The upstream patch series (upstream/patches/): the crate's core as
# kube-runtime's `lease` module. See scripts/upstream.py and docs/upstream-proposal.md.
#
#   scripts/upstream.sh generate   # write the series from the sources
#   scripts/upstream.sh check      # fail if it is stale, or does not apply,
#                                  # build, test, lint, document and format on
#                                  # kube-rs 5.0.0 (the published crates)
#   scripts/upstream.sh stats      # the size of each patch
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
exec python3 "$root/scripts/upstream.py" "$@"
