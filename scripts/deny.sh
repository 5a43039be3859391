#!/usr/bin/env bash
# Runs `cargo deny check` (advisories, bans, licenses, sources).
# Advisories: from the offline RustSec snapshot in ../shared/advisory-db
# ($KRL_SHARED_DIR/advisory-db) when it is there, with `--offline`; otherwise
# cargo-deny fetches the advisory database itself (deny.toml's db-urls), as it
# normally does. One line on stderr says which.
# Installs cargo-deny (pinned) into the project's tool cache when missing.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
# shellcheck source=scripts/lib/tools.sh
. "$root/scripts/lib/tools.sh"
deny="$(cargo_tool cargo-deny 0.20.2 cargo-deny)"

shared="${KRL_SHARED_DIR:-$root/../shared}"
snapshot="$shared/advisory-db"
# cargo-deny 0.20 reads <db-path>/advisory-db-3157b0e258782691 (derived from its
# default URL; db-path is target/advisory-dbs in deny.toml).
db="$root/target/advisory-dbs/advisory-db-3157b0e258782691"

cargo fetch --locked >/dev/null
if [ -d "$snapshot" ]; then
    echo "deny.sh: advisories from the offline snapshot at $snapshot" >&2
    # cargo-deny asks git for the HEAD commit's date: make the copy a repository.
    stamp="$(cd "$snapshot" && ls -la --time-style=+%s . | md5sum | cut -c1-16)"
    if [ ! -f "$db/.krl-stamp" ] || [ "$(cat "$db/.krl-stamp")" != "$stamp" ]; then
        rm -rf "$db" && mkdir -p "$(dirname "$db")"
        cp -r "$snapshot" "$db"
        chmod -R u+w "$db"
        date="$(sed -n 's/.*commit [0-9a-f]*, \([0-9-]*\)).*/\1/p' "$snapshot/SNAPSHOT.md" | head -1)"
        date="${date:-2026-08-21}T00:00:00Z"
        (cd "$db" && git init -q && git add -A &&
            GIT_AUTHOR_DATE="$date" GIT_COMMITTER_DATE="$date" \
            git -c user.name=snapshot -c user.email=snapshot@localhost commit -qm snapshot)
        echo "$stamp" > "$db/.krl-stamp"
    fi
    exec "$deny" --offline check "$@"
fi

echo "deny.sh: no advisory snapshot at $snapshot: cargo-deny fetches the advisory database (https://github.com/rustsec/advisory-db)" >&2
# A copy of the snapshot left by an earlier run is no clone of the database:
# let cargo-deny clone it afresh.
if [ -f "$db/.krl-stamp" ]; then rm -rf "$db"; fi
exec "$deny" check "$@"
