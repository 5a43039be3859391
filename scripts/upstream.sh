#!/usr/bin/env bash
# The upstream patch series (upstream/patches/): the crate's core as
# kube-runtime's `lease` module. See scripts/upstream.py and docs/upstream-proposal.md.
#
#   scripts/upstream.sh generate   # write the series from the sources
#   scripts/upstream.sh check      # fail if it is stale, or does not apply,
#                                  # build, test, lint, document and format on
#                                  # kube-rs 5.0.0 (the published crates)
#   scripts/upstream.sh stats      # the size of each patch
#   scripts/upstream.sh check-docs # the kube-rs website patch (upstream/kube-docs/) and
#                                  # the kube example (upstream/kube-examples/): scripts/upstream_docs.py
#   scripts/upstream.sh generate-pr1 | check-pr1   # pull request 1 alone
#                                  # (scripts/upstream_pr.py, upstream/pr1/)
#   scripts/upstream.sh generate-followups | check-prs   # PR1, then each follow-up's patch
#                                  # in turn (upstream/followups/), and the distance to the end state
#   scripts/upstream.sh followup-tree N DIR   # PR1 and follow-ups 1..N in DIR, a git repository,
#                                  # one commit per step, to edit follow-up N
#   scripts/upstream.sh followup-save N DIR   # follow-up N's patch, written back from DIR
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
exec python3 "$root/scripts/upstream.py" "$@"
