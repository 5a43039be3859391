#!/usr/bin/env python3
"""The two small upstream contributions beside the patch series, and their check.

    scripts/upstream.sh check-docs

- upstream/kube-docs/: kube-rs's website page that lists third-party leader
  election crates (docs/controllers/availability.md of kube-rs/website, an
  exact copy at the commit below) and a patch adding this crate to its list.
  The check verifies that the stored page is that commit's blob, that the
  patch applies to it without fuzz (`git apply`), and that it adds exactly
  one line, to the list, and removes none. The check cannot fetch from
  GitHub: refreshing the page is by hand (see upstream/kube-docs/README.md).
- upstream/kube-examples/: `lease_controller.rs`, a program for kube-rs's
  `examples/`, and `Cargo.toml.snippet`, what kube's manifests need for it.
  The check counts its lines (every line, blank ones included, as `wc -l`
  does; 150 to 250), checks its formatting with kube-rs's rustfmt.toml
  (nightly rustfmt, as kube-rs runs it: scripts/upstream.py's pinned one),
  then builds it and runs clippy with
  `-D warnings` and kube-rs's clippy.toml in a scratch cargo project: kube
  5.0.0 from the registry with the features kube's examples enable by
  default, `k8s-openapi/latest` (in the scratch project only), and this
  repository's crate by path. The workspace's Cargo.lock is copied in, so
  the versions are the workspace's and nothing new is fetched when they are
  in cargo's cache (the build runs `--offline` first, and online only if
  that fails). Scratch project and target directory:
  target/upstream-docs/, kept between runs so that builds are incremental.
"""

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "upstream" / "kube-docs"
EXAMPLES = ROOT / "upstream" / "kube-examples"
KUBE_RS = ROOT / "upstream" / "kube-rs"
SCRATCH = ROOT / "target" / "upstream-docs"

# Where the stored page comes from (kube-rs/website).
WEBSITE_COMMIT = "e9e44a513285a8bbadc6442e2fd7fbb35e72bdcc"
PAGE_PATH = "docs/controllers/availability.md"
PAGE_BLOB = "380a06c4a7062c5142ffcc76326601e09a624cad"
PAGE_SECTION = "### Third Party Crates"

EXAMPLE = "lease_controller"
EXAMPLE_LINES = (150, 250)
KUBE_VERSION = "5.0.0"
# kube's examples/Cargo.toml: its default features `rustls-tls` and `runtime`.
KUBE_FEATURES = ["client", "rustls-tls", "ring", "unstable-client", "runtime", "unstable-runtime"]


def fail(msg):
    sys.exit(f"upstream check-docs: {msg}")


def say(msg):
    print(f"upstream check-docs: {msg}", flush=True)


def run(*args, cwd=None, env=None, check=True):
    result = subprocess.run(args, cwd=cwd, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    if check and result.returncode != 0:
        print(result.stdout, end="")
        fail(f"`{' '.join(map(str, args))}` failed ({result.returncode})")
    return result


def git_blob(data):
    """The git blob id of `data` (what `git hash-object` prints)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


# ---------------------------------------------------------------------------
# The website page and its patch.


def check_page():
    page = DOCS / "availability.md"
    blob = git_blob(page.read_bytes())
    if blob != PAGE_BLOB:
        fail(f"{page.relative_to(ROOT)} is not {PAGE_PATH} of kube-rs/website at {WEBSITE_COMMIT[:12]} "
             f"(blob {blob}, expected {PAGE_BLOB})")
    patches = sorted(DOCS.glob("*.patch"))
    if len(patches) != 1:
        fail(f"expected one patch in {DOCS.relative_to(ROOT)}, found {len(patches)}")
    patch = patches[0]
    text = patch.read_text()
    added = [l[1:] for l in text.splitlines() if l.startswith("+") and not l.startswith("+++")]
    removed = [l for l in text.splitlines() if l.startswith("-") and not l.startswith("---")]
    if len(added) != 1 or removed:
        fail(f"{patch.name} must add one line and remove none (adds {len(added)}, removes {len(removed)})")
    with tempfile.TemporaryDirectory(prefix="upstream-docs-") as tree:
        tree = Path(tree)
        (tree / PAGE_PATH).parent.mkdir(parents=True)
        shutil.copy(page, tree / PAGE_PATH)
        # Inside a repository of its own, so that git applies relative to it
        # whatever directory the temporary one is in.
        run("git", "init", "--quiet", cwd=tree)
        applied = run("git", "apply", "--verbose", str(patch), cwd=tree, check=False)
        if applied.returncode != 0:
            print(applied.stdout, end="")
            fail(f"{patch.name} does not apply to the stored page")
        after = (tree / PAGE_PATH).read_text()
    lines = after.splitlines()
    at = lines.index(added[0])
    section = max((i for i in range(at) if lines[i].startswith("#")), default=-1)
    if section < 0 or lines[section] != PAGE_SECTION or not lines[at - 1].startswith("- ["):
        fail(f"{patch.name} adds its line outside the list under {PAGE_SECTION!r}")
    if "kube-runtime-lease" not in added[0]:
        fail(f"{patch.name}'s line does not name kube-runtime-lease")
    say(f"{patch.name} applies to {PAGE_PATH} at kube-rs/website {WEBSITE_COMMIT[:12]}, adding:")
    print(f"    {added[0]}")


# ---------------------------------------------------------------------------
# The example program.


def count_lines(path):
    lines = path.read_text().splitlines()
    blank = sum(1 for l in lines if not l.strip())
    comment = sum(1 for l in lines if l.strip().startswith("//"))
    return len(lines), len(lines) - blank - comment, comment, blank


def check_format(example):
    sys.path.insert(0, str(ROOT / "scripts"))
    import upstream

    config = KUBE_RS / "rustfmt.toml"
    result = run(*upstream.nightly_rustfmt(), "--check", "--edition", "2024", "--config-path", str(config),
                 str(example), check=False)
    if result.returncode != 0:
        print(result.stdout, end="")
        fail(f"{example.name} is not formatted as kube-rs's rustfmt.toml asks (nightly rustfmt)")


def scratch_manifest():
    crate = ROOT / "kube-runtime-lease"
    features = ", ".join(f'"{f}"' for f in KUBE_FEATURES)
    return f"""\
# Written by scripts/upstream_docs.py: kube-rs's examples crate, reduced to
# what examples/{EXAMPLE}.rs needs, on kube {KUBE_VERSION} from the registry.
[package]
name = "kube-examples-lease"
version = "0.0.0"
edition = "2024"
publish = false

# Not a member of the repository's workspace (it lives under its target/).
[workspace]

[dev-dependencies]
kube = {{ version = "={KUBE_VERSION}", default-features = false, features = [{features}] }}
# The Kubernetes version, as kube's examples choose it (feature `latest`).
k8s-openapi = {{ version = "0.29", default-features = false, features = ["latest"] }}
kube-runtime-lease = {{ path = "{crate}" }}
anyhow = "1.0.71"
futures = {{ version = "0.3.17", default-features = false, features = ["async-await"] }}
thiserror = "2.0.15"
tokio = {{ version = "1.40", features = ["full"] }}
tracing = "0.1.36"
tracing-subscriber = "0.3.17"

[[example]]
name = "{EXAMPLE}"
path = "{EXAMPLE}.rs"
"""


def cargo(project, target, *args):
    env = dict(os.environ)
    env["CARGO_TARGET_DIR"] = str(target)
    # As the workspace's profile does: debug info is most of a target directory.
    env["CARGO_PROFILE_DEV_DEBUG"] = "false"
    base = ["cargo", *args[:1], "--manifest-path", str(project / "Cargo.toml"), *args[1:]]
    split = base.index("--") if "--" in base else len(base)
    offline = base[:split] + ["--offline"] + base[split:]
    result = run(*offline, env=env, check=False)
    # A crate missing from cargo's cache (cargo names the offline mode): online.
    if result.returncode != 0 and "offline" in result.stdout and "could not compile" not in result.stdout:
        say("not everything is in cargo's cache: trying again online")
        result = run(*base, env=env, check=False)
    if result.returncode != 0:
        print(result.stdout, end="")
        fail(f"cargo {args[0]} of {EXAMPLE}.rs failed")
    return result


def check_example():
    example = EXAMPLES / f"{EXAMPLE}.rs"
    total, code, comment, blank = count_lines(example)
    low, high = EXAMPLE_LINES
    if not low <= total <= high:
        fail(f"{example.name} has {total} lines, outside {low}-{high}")
    say(f"{example.name}: {total} lines (every line, as wc -l counts: {code} code, {comment} comment, {blank} blank)")
    check_format(example)

    project = SCRATCH / "project"
    target = SCRATCH / "target"
    if project.exists():
        shutil.rmtree(project)
    project.mkdir(parents=True)
    (SCRATCH / "CACHEDIR.TAG").write_text("Signature: 8a477f597d28d172789f06886806bc55\n")
    (project / "Cargo.toml").write_text(scratch_manifest())
    shutil.copy(example, project / example.name)
    shutil.copy(ROOT / "Cargo.lock", project / "Cargo.lock")
    shutil.copy(KUBE_RS / "clippy.toml", project / "clippy.toml")

    say(f"building {example.name} against kube {KUBE_VERSION} (scratch project {project.relative_to(ROOT)})")
    cargo(project, target, "build", "--example", EXAMPLE)
    say("clippy -D warnings (kube-rs's clippy.toml)")
    result = cargo(project, target, "clippy", "--example", EXAMPLE, "--", "-D", "warnings")
    warnings = [l for l in result.stdout.splitlines() if l.startswith("warning") and "kube-examples-lease" in l]
    if warnings:
        print(result.stdout, end="")
        fail(f"clippy warns on {example.name}")
    lock = (project / "Cargo.lock").read_text()
    for crate, version in [("kube", KUBE_VERSION), ("kube-runtime", KUBE_VERSION)]:
        if not re.search(rf'name = "{crate}"\nversion = "{re.escape(version)}"\nsource = "registry', lock):
            fail(f"the scratch project did not build against {crate} {version} from the registry")


def check_docs():
    check_page()
    check_example()
    say("the website patch applies; the example is within its size, formatted, and builds and lints clean "
        f"against kube {KUBE_VERSION}")


if __name__ == "__main__":
    check_docs()
