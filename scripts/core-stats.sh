#!/usr/bin/env bash
# The size and shape of the crate's core against the redesign's targets
# (code lines with the extras off, the largest file, feature cfgs).
#   scripts/core-stats.sh           # print
#   scripts/core-stats.sh --check   # print, and fail when a target is missed
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
exec python3 "$root/scripts/core_stats.py" "$@"
