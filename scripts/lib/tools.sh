# shellcheck shell=bash
# Sourced by the scripts that need a pinned cargo tool (deny.sh, mutants.sh):
# `cargo_tool <crate> <version> <binary> [--version args...]` installs the
# crate at that version into the project's tool cache ($KRL_CACHE_DIR, else
# ~/.cache/kube-runtime-lease) when the binary there is missing or another
# version, and prints the binary's path.
cargo_tool() {
    local crate="$1" version="$2" binary="$3"
    shift 3
    local cache="${KRL_CACHE_DIR:-${HOME:-/root}/.cache/kube-runtime-lease}"
    local tools="$cache/tools"
    local path="$tools/bin/$binary"
    if ! "$path" "$@" --version 2>/dev/null | grep -q "$version"; then
        echo "installing $crate $version into $tools (a few minutes, once)" >&2
        cargo install "$crate" --version "$version" --locked --root "$tools" >&2
    fi
    echo "$path"
}
