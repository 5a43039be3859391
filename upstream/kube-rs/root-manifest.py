#!/usr/bin/env python3
"""Prints kube-rs's root Cargo.toml at 5.0.0 as the published crates resolve it.

    python3 upstream/kube-rs/root-manifest.py DIR > upstream/kube-rs/Cargo.toml

DIR holds the unpacked published crates, one folder each (kube, kube-client,
kube-core, kube-derive, kube-runtime), as scripts/upstream.py unpacks them.
"""
import sys
import tomllib

CRATES = ["kube", "kube-client", "kube-core", "kube-derive", "kube-runtime"]


def main(root):
    ws = {}
    pkg = None
    for c in CRATES:
        orig = tomllib.load(open(f"{root}/{c}/Cargo.toml.orig", "rb"))
        norm = tomllib.load(open(f"{root}/{c}/Cargo.toml", "rb"))
        pkg = norm["package"]
        tables = [(orig, norm)]
        for t, spec in orig.get("target", {}).items():
            tables.append((spec, norm["target"][t]))
        for o, n in tables:
            for sect in ["dependencies", "dev-dependencies", "build-dependencies"]:
                for name, spec in o.get(sect, {}).items():
                    if not (isinstance(spec, dict) and spec.get("workspace")):
                        continue
                    resolved = n[sect][name]
                    local = set(spec.get("features", []))
                    e = ws.setdefault(name, {"version": resolved["version"]})
                    if resolved.get("default-features") is False:
                        e["default-features"] = False
                    extra = [f for f in resolved.get("features", []) if f not in local]
                    if extra:
                        e.setdefault("features", set()).update(extra)
    out = [HEADER]
    out.append(f'version = "{pkg["version"]}"')
    out.append("authors = [" + ", ".join(f'"{a}"' for a in pkg["authors"]) + "]")
    out.append(f'repository = "{pkg["repository"]}"')
    out.append('readme = "README.md"')
    out.append(f'license = "{pkg["license"]}"')
    out.append(f'edition = "{pkg["edition"]}"')
    out.append(f'rust-version = "{pkg["rust-version"]}"')
    out.append(LINTS)
    for name in sorted(ws):
        e = ws[name]
        parts = [f'version = "{e["version"]}"']
        if e.get("default-features") is False:
            parts.append("default-features = false")
        if e.get("features"):
            parts.append("features = [" + ", ".join(f'"{f}"' for f in sorted(e["features"])) + "]")
        out.append(f"{name} = {{ " + ", ".join(parts) + " }")
    print("\n".join(out))


HEADER = """# The root manifest of kube-rs's tree at 5.0.0, for scripts/upstream.sh
# (see README.md here): made by root-manifest.py from the published crates.
[workspace]
default-members = ["kube"]
resolver = "1"
members = ["kube", "kube-client", "kube-core", "kube-derive", "kube-runtime"]

[workspace.package]"""

LINTS = """
[workspace.lints.rust]
unsafe_code = "forbid"
missing_docs = "deny"

[workspace.dependencies]"""

if __name__ == "__main__":
    main(sys.argv[1])
