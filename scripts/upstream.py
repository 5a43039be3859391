#!/usr/bin/env python3
"""The upstream patch series: the crate's core as `kube_runtime::lease`.

    scripts/upstream.sh generate   # writes upstream/patches/ from the sources
    scripts/upstream.sh check      # fails if they are stale, or do not apply,
                                   # build, test, lint, document and format
                                   # as kube-rs's own code must
    scripts/upstream.sh stats      # the size of each patch (for the PR text)
    scripts/upstream.sh check-docs # the website patch and the kube example (scripts/upstream_docs.py)
    scripts/upstream.sh generate-pr1 | check-pr1   # pull request 1 (scripts/upstream_pr.py)
    scripts/upstream.sh generate-followups | check-prs   # PR1 and its follow-ups (upstream/followups/)
    scripts/upstream.sh followup-tree N DIR | followup-save N DIR   # edit follow-up N as a commit

The series is made by a deterministic transformation of this crate's core
(see STEPS): `upstream-gen` (upstream/gen) evaluates the cargo features with
every extra off and strips the crate-only seams (CRATE_ONLY_SEAMS: the
observer seam, which only the extras use, and which would be dead code
upstream; generation fails when a listed name is found nowhere); then module
paths are rewritten (`crate::` becomes `crate::lease::`, `kube_runtime::` becomes `crate::`; doc examples use
`kube::runtime::lease`), names take kube-runtime's idiom (RENAMES: `LeaseConfig` is
`lease::Config`, as `watcher::Config` is), `mod` lines of files a step does not carry yet are
dropped, lines between `<!-- upstream: omit -->` and `<!-- upstream: end -->`
in docs are dropped, and nightly rustfmt formats the result with kube-rs's rustfmt.toml (`NIGHTLY`).

Each commit is authored and signed off (`Signed-off-by:`) by this
repository's `git config user.name` and `user.email`; `check` regenerates
the series as the committed patches' author, and checks kube's conventions
that the build cannot (scripts/upstream_conventions.py: sign-offs, no
`dead_code`, docs that name only kube's things; scripts/upstream_imports.py:
the imports' shape of kube-rs's nightly rustfmt options).

The base is kube-rs's tree at 5.0.0 as the published crates carry it: each
crate's `src/` and its git manifest (`Cargo.toml.orig`), downloaded by cargo
from the registry, plus the root files in upstream/kube-rs/ (see its README).
"""

import email.header
import email.utils
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from functools import cache
from pathlib import Path

import upstream_conventions
from upstream_imports import check_paths as check_imports, reshape as reshape_imports

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "kube-runtime-lease" / "src"
UPSTREAM = ROOT / "upstream"
PATCHES = UPSTREAM / "patches"
CACHE = Path(os.environ.get("KRL_CACHE_DIR", Path.home() / ".cache" / "kube-runtime-lease")) / "upstream"
KUBE_VERSION = "5.0.0"
KUBE_CRATES = ["kube", "kube-client", "kube-core", "kube-derive", "kube-runtime"]
FEATURE = "unstable-runtime-lease"
DATE = "2026-12-01T00:00:00+00:00"

# Each step: its subject, the files of the crate's src/ it adds (beside the
# ones of earlier steps), and what else it changes in kube-rs's tree. No
# patch carries dead code (nor an allow of it): a crate-private item of an
# earlier step's file that only this step uses comes with this step
# (`brings`: per file, `fn NAME` for the item with its docs and attributes,
# `line REGEX` for the single lines of a test that use it; see `hold_back`).
# Code that only the crate's extras use is stripped (CRATE_ONLY_SEAMS).
STEPS = [
    {
        "subject": "runtime: add the lease module: the election's configuration",
        "body": (
            "The first part of leader election on coordination.k8s.io/v1 Leases\n"
            "(kube-rs/kube#485), behind the new feature `unstable-runtime-lease`,\n"
            "which `unstable-runtime` includes (kube reaches it through that):\n"
            "LeaseConfig with client-go's validation rules."
        ),
        "files": [
            "config/mod.rs", "config/error.rs", "config/names.rs", "config/tests.rs",
        ],
        "feature": True,
    },
    {
        "subject": "runtime: lease: an in-memory Lease API for the module's tests",
        "body": (
            "A double of the Lease API behind a real kube Client (a tower\n"
            "service), so that the election's tests run on paused time without\n"
            "a cluster: Leases with resourceVersions, lists and watches, and\n"
            "faults (status answers, latency, partitions, a lagging watch\n"
            "cache). Test-only; its dev-dependencies are already in\n"
            "kube-client's tree."
        ),
        "files": [
            "test_util/mod.rs", "test_util/leases.rs", "test_util/server.rs", "test_util/wire.rs",
            "test_util/tests.rs", "tests/mod.rs", "tests/runtime.rs",
        ],
        "dev_deps": True,
    },
    {
        "subject": "runtime: lease: LeaderElector, LeaseGuard and Lost",
        "body": (
            "The election: the pure rules of the Lease record (what to write to\n"
            "take, renew and release a Lease, and when another holder's record\n"
            "may be taken over); one background task per Lease that campaigns\n"
            "while leadership is wanted, renews, and releases; LeaseGuard, a future\n"
            "that resolves to Lost when the term ends (renew deadline passed on\n"
            "its own clock, taken over, deleted, stepped down, shutdown); the\n"
            "off switch; status, health check and a bounded shutdown."
        ),
        "files": [
            "record.rs", "record/tests.rs", "error.rs", "term.rs", "guard.rs",
            "elector/mod.rs", "elector/acquire.rs", "elector/api.rs",
            "elector/memory.rs", "elector/memory/tests.rs",
            "elector/status.rs", "elector/supervise.rs", "elector/test_hooks.rs",
            "elector/task/mod.rs", "elector/task/campaign.rs", "elector/task/end.rs",
            "elector/task/lead.rs", "elector/task/renew.rs", "elector/task/view.rs",
            "elector/task/view/tests.rs",
            "elector/tests/mod.rs", "elector/tests/campaign.rs", "elector/tests/supervise.rs",
            "elector/tests/contact.rs", "lease_observer.rs", "lease_observer/tests.rs",
            "tests/support.rs",
        ],
        "brings": {
            "config/mod.rs": ["fn lease_duration_seconds", "fn span"],
            "config/tests.rs": [r"line assert_eq!\(c\.lease_duration_seconds\(\), "],
        },
    },
    {
        "subject": "runtime: lease: guarded streams and Controllers, run_each_term",
        "body": (
            "`.with_leader_election(&elector)` on any Stream and on Controller:\n"
            "the stream is not polled before the Lease is won and is dropped the\n"
            "moment it is lost (within one item of the renew deadline, on its\n"
            "own clock); `LeaderElector::run_each_term` rejoins the election\n"
            "after a loss. The module's documentation."
        ),
        "files": ["stream.rs", "stream/each_term.rs", "stream/tests.rs", "controller/mod.rs", "scope.rs", "scope/tests.rs"],
        "final": True,
        "brings": {
            "guard.rs": ["fn parts", "fn timer_armed"],
            "tests/support.rs": ["fn busy"],
            "elector/mod.rs": ["fn is_shut_down"],
            "term.rs": ["fn expire_for_test"],
        },
    },
    {
        "subject": "runtime: lease: regression tests of the election",
        "body": (
            "The schedules that once broke \"exactly one leader, never none\"\n"
            "(creation holds bypassed, duplicate identities after a pause,\n"
            "releases after stopped work, writes answered 409 after being\n"
            "applied, tasks on runtimes no longer driven, wake-up storms, and\n"
            "more), each a test on the in-memory Lease API that failed before\n"
            "its fix. Test-only."
        ),
        "files": ["tests/regressions.rs", "tests/never_none.rs"],
        "final": True,
        "brings": {
            "elector/test_hooks.rs": ["fn remove", "fn set_storm_for_test"],
        },
    },
]

# The crate-only seams: code of the core that only the crate's extras use,
# so that with every extra off it is dead code, which kube's pull requests
# may not carry (nor an allow of it). upstream-gen strips each name given
# with `--strip` (see upstream/gen/src/main.rs): the module, items, fields
# and struct-literal fields of that name, the `use`s of them, the
# statements that call a function or method of that name (and an `if`
# without `else` left with nothing else, an `impl` left empty). Generation fails
# when a name is stripped nowhere (renamed in the crate: rename it here);
# `check`'s compile of the series fails on anything left that names one.
CRATE_ONLY_SEAMS = {
    # The observer seam: the election tells its observers of every
    # Transition; only the extras `metrics` (metrics.rs) and `events`
    # (elector/events.rs) add observers.
    "observer": [
        "observer",  # elector/observer.rs, the module (and its tests)
        "Observer", "Observers", "Transition",  # its trait, list and events
        "observers",  # Inner's field, and its initializer in LeaderElector::new
        "tell",  # Inner::tell; each `self.inner.tell(...)`, `self.observers.tell(...)`
        "renewal_told",  # Task::renewal_told (elector/task/renew.rs) and its calls
    ],
    # The extras' hooks: config/extras.rs and elector/extras.rs, where each
    # extra attaches under its feature; the core calls them unconditionally,
    # and without the features each does nothing.
    "extras": [
        "extras",  # the two modules; LeaseConfig's and State's fields; each
        # statement that reads them (`self.extras.validate(..)?;`,
        # `let (config, state) = extras::set_up(config, state);`, ...)
    ],
    # The simulation (tests/simulation/, which stays in the crate) seeds the
    # election's jitter, so that a seed replays: `config::random_u64` asks it
    # first, in tests.
    "simulation": [
        "simulation",  # `if let Some(bits) = crate::tests::simulation::seeded_bits()`
    ],
    # The misuse suite (tests/misuse.rs) stays in the crate: it drives the
    # extras (configured annotations, shards) at their extremes.
    "misuse": ["misuse"],
    # What the logs say with several elections in one process
    # (tests/log_lines.rs) stays in the crate: it drives the extras
    # (Events, shards) beside the core.
    "log_lines": ["log_lines"],
}
SEAM_NAMES = sorted({name for names in CRATE_ONLY_SEAMS.values() for name in names})

# Files that exist only in the module's tests.
TEST_FILES = re.compile(r"(^|/)tests(\.rs|/)|^test_util/")


def run(*args, cwd=None, env=None, check=True, capture=False):
    kw = {"cwd": cwd, "env": env, "check": check, "text": True}
    if capture:
        kw["stdout"] = subprocess.PIPE
    return subprocess.run(args, **kw)


def gen_tool():
    manifest = UPSTREAM / "gen" / "Cargo.toml"
    target = CACHE / "gen-target"
    run("cargo", "build", "--quiet", "--release", "--locked", "--manifest-path", str(manifest), "--target-dir", str(target))
    return target / "release" / "upstream-gen"


# ---------------------------------------------------------------------------
# The base: kube-rs's tree at 5.0.0, from the published crates.


def kube_sources():
    """The published kube crates' sources, unpacked once into the cache."""
    out = CACHE / f"kube-{KUBE_VERSION}"
    if all((out / c / "Cargo.toml.orig").exists() for c in KUBE_CRATES):
        return out
    fetch = CACHE / "fetch"
    (fetch / "src").mkdir(parents=True, exist_ok=True)
    (fetch / "src" / "main.rs").write_text("fn main() {}\n")
    deps = "\n".join(f'{c} = "={KUBE_VERSION}"' for c in KUBE_CRATES)
    (fetch / "Cargo.toml").write_text(
        f'[package]\nname = "fetch"\nversion = "0.0.0"\nedition = "2024"\n\n[dependencies]\n{deps}\n'
    )
    run("cargo", "fetch", "--quiet", "--manifest-path", str(fetch / "Cargo.toml"))
    home = Path(os.environ.get("CARGO_HOME", Path.home() / ".cargo"))
    tmp = Path(tempfile.mkdtemp(dir=CACHE))
    for crate in KUBE_CRATES:
        found = sorted(home.glob(f"registry/cache/*/{crate}-{KUBE_VERSION}.crate"))
        if not found:
            sys.exit(f"upstream: {crate} {KUBE_VERSION} is not in {home}/registry/cache after cargo fetch")
        with tarfile.open(found[0]) as tar:
            tar.extractall(tmp, filter="data")
        (tmp / f"{crate}-{KUBE_VERSION}").rename(tmp / crate)
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    return out


def base_tree(dest):
    """kube-rs's tree at 5.0.0 in `dest`, as one commit."""
    sources = kube_sources()
    dest.mkdir(parents=True)
    for crate in KUBE_CRATES:
        src = sources / crate
        shutil.copytree(src / "src", dest / crate / "src")
        for extra in ["README.md", "benches", "tests", "build.rs"]:
            p = src / extra
            if p.is_dir():
                shutil.copytree(p, dest / crate / extra)
            elif p.exists():
                shutil.copy(p, dest / crate / extra)
        shutil.copy(src / "Cargo.toml.orig", dest / crate / "Cargo.toml")
    for f in ["Cargo.toml", "Cargo.lock", "rustfmt.toml", "clippy.toml"]:
        shutil.copy(UPSTREAM / "kube-rs" / f, dest / f)
    git(dest, "init", "--quiet", "--initial-branch=main")
    git(dest, "add", "-A")
    git(dest, "commit", "--quiet", "-m", f"kube-rs {KUBE_VERSION}, as its published crates carry it")
    return dest


# The author `check` regenerates the series as: the committed patches' own,
# so that a clone with another git identity checks the same series.
AUTHOR_OVERRIDE = None


@cache
def identity():
    """The series' author: this repository's `git config user.name` and
    `user.email` (kube-rs asks a real name and a sign-off on each commit)."""
    if AUTHOR_OVERRIDE:
        return AUTHOR_OVERRIDE

    def get(key):
        out = subprocess.run(["git", "config", key], cwd=ROOT, text=True, stdout=subprocess.PIPE).stdout.strip()
        if not out:
            sys.exit(f"upstream: `git config {key}` is not set: the series' commits are authored and signed off by it")
        return out
    return get("user.name"), get("user.email")


def signed_off(message):
    """`message` with the DCO's sign-off of the series' author as its last line."""
    name, mail = identity()
    return f"{message}\n\nSigned-off-by: {name} <{mail}>"


def git(cwd, *args, capture=False):
    name, mail = identity()
    env = dict(os.environ)
    env.update(
        GIT_AUTHOR_NAME=name,
        GIT_AUTHOR_EMAIL=mail,
        GIT_COMMITTER_NAME=name,
        GIT_COMMITTER_EMAIL=mail,
        GIT_AUTHOR_DATE=DATE,
        GIT_COMMITTER_DATE=DATE,
    )
    return run("git", "-c", "core.autocrlf=false", *args, cwd=cwd, env=env, capture=capture)


# ---------------------------------------------------------------------------
# The transformation.

OMIT = re.compile(r"^\s*//[/!]\s*<!-- upstream: omit -->\s*$")
END = re.compile(r"^\s*//[/!]\s*<!-- upstream: end -->\s*$")
DOC = re.compile(r"^(\s*)(//[/!])( ?)(.*)$")
MOD = re.compile(r"^\s*(pub(\([a-z:]+\))? )?mod ([a-z_0-9]+);\s*$")


def target_of(rel):
    """Where a file of the crate's src/ goes in kube-runtime's src/."""
    return "lease/mod.rs" if rel == "lib.rs" else f"lease/{rel}"


def child_file(rel, name, present):
    """The file a `mod name;` in `rel` refers to, if it is among `present`."""
    parent = Path(rel).parent
    if Path(rel).name not in ("lib.rs", "mod.rs"):
        parent = parent / Path(rel).stem
    for cand in (parent / f"{name}.rs", parent / name / "mod.rs"):
        s = str(cand).removeprefix("./")
        if s in present:
            return s
    return None


# Names the module takes in kube-runtime's idiom (`watcher::Config`, `controller::Config`):
# inside `kube_runtime::lease`, the crate's `LeaseConfig` is `lease::Config`.
RENAMES = {"LeaseConfig": "Config"}
RENAME = re.compile(r"\b(" + "|".join(RENAMES) + r")\b")


def rename(text):
    return RENAME.sub(lambda m: RENAMES[m.group(1)], text)


def rewrite_code(line):
    line = rename(line)
    line = re.sub(r"\bcrate::", "crate::lease::", line)
    line = re.sub(r"\bkube_runtime::", "crate::", line)
    return line.replace("kube_runtime_lease::", "crate::lease::")


def rewrite_doc(text, in_code):
    text = rename(text)
    if in_code:
        text = text.replace("kube_runtime_lease::", "kube::runtime::lease::")
        text = re.sub(r"\bkube_client::", "kube::", text)
        text = re.sub(r"\bkube_runtime::", "kube::runtime::", text)
        return text
    text = re.sub(r"\bcrate::", "crate::lease::", text)
    return re.sub(r"\bkube_runtime::", "crate::", text)


def transform(text, rel, present):
    out = []
    omitting = False
    in_code = False
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if OMIT.match(line):
            omitting = True
            continue
        if END.match(line):
            omitting = False
            continue
        if omitting:
            continue
        if rel == "lib.rs" and line.startswith("#!["):
            continue  # kube-runtime's lib.rs sets the lints
        m = MOD.match(line)
        if m and child_file(rel, m.group(3), present) is None:
            # Drop the attributes above it too.
            while out and out[-1].strip().startswith("#["):
                out.pop()
            continue
        d = DOC.match(line)
        if d and d.group(2) in ("///", "//!"):
            body = d.group(4)
            # A fence may be indented (a code block inside a list item).
            fence = body.lstrip().startswith("```")
            if fence:
                in_code = not in_code
            out.append(d.group(1) + d.group(2) + d.group(3) + rewrite_doc(body, in_code and not fence))
            continue
        if line.lstrip().startswith("//"):
            out.append(rename(line))
            continue
        out.append(rewrite_code(line))
    text = "\n".join(out)
    return text


def interim_mod(text, step):
    """lease/mod.rs before the last step: its module docs say what is there so far."""
    body = [l for l in text.split("\n") if not l.startswith("//!")]
    while body and not body[0].strip():
        body.pop(0)
    head = [
        "//! Leader election with `coordination.k8s.io/v1` Leases, following client-go's",
        "//! `leaderelection` protocol (in progress: the module's documentation comes with",
        "//! the guarded streams).",
        "",
    ]
    # Re-exports of modules this step does not carry yet.
    kept = []
    for l in body:
        m = re.match(r"^pub use (?:self::)?([a-z_]+)::", l)
        if m and f"lease/{m.group(1)}.rs" not in step and f"lease/{m.group(1)}/mod.rs" not in step:
            continue
        kept.append(l)
    return "\n".join(head + kept)


def hold_back(text, rel, n):
    """The file `rel` of the crate's src/ (as upstream-gen evaluated it) at
    step `n`: without the items that a later step `brings` (their only users
    come with it). Fails when one is not there, or not once."""
    for later in STEPS[n:]:
        for what in later.get("brings", {}).get(rel, []):
            kind, _, name = what.partition(" ")
            lines = text.split("\n")
            if kind == "line":
                hits = [i for i, l in enumerate(lines) if re.search(name, l)]
                if not hits or any(not lines[i].rstrip().endswith(";") for i in hits):
                    sys.exit(f"upstream: {rel} has no single-line statement matching {name!r} to hold back")
                text = "\n".join(l for i, l in enumerate(lines) if i not in hits)
                continue
            pat = re.compile(rf"^(\s*)(pub(\([a-z:]+\))? )?((const|async|unsafe) )*{kind} {re.escape(name)}\b")
            hits = [i for i, l in enumerate(lines) if pat.match(l)]
            if len(hits) != 1:
                sys.exit(f"upstream: {rel} has {len(hits)} `{what}` to hold back until a later patch (one expected)")
            i = hits[0]
            indent = pat.match(lines[i]).group(1)
            end = i
            if not lines[i].rstrip().endswith(";"):
                end = next(j for j in range(i + 1, len(lines)) if lines[j] == indent + "}")
            begin = i
            while begin > 0 and lines[begin - 1].startswith(indent) and re.match(r"\s*(#\[|//)", lines[begin - 1]) \
                    and not lines[begin - 1].strip().startswith("//!"):
                begin -= 1
            # The blank line above it too, when there is one.
            if begin > 0 and not lines[begin - 1].strip():
                begin -= 1
            text = "\n".join(lines[:begin] + lines[end + 1:])
    return text


def evaluate(tool, rel, stripped):
    """The file `rel` of the crate's src/ as upstream-gen evaluates it (every
    extra off, the crate-only seams stripped); adds the seams' names it
    stripped to `stripped`."""
    strip = [a for name in SEAM_NAMES for a in ("--strip", name)]
    out = subprocess.run([str(tool), str(SRC / rel), *strip], text=True, capture_output=True)
    for line in out.stderr.splitlines():
        if line.startswith("upstream-gen: stripped "):
            stripped.add(line.removeprefix("upstream-gen: stripped "))
        else:
            print(line, file=sys.stderr)
    if out.returncode != 0:
        sys.exit(f"upstream: upstream-gen failed on {rel}")
    return out.stdout


def generate_step_files(tree, tool, files, n, stripped):
    present = set(files) | {"lib.rs"}
    written = {}
    for rel in sorted(present):
        evaluated = hold_back(evaluate(tool, rel, stripped), rel, n)
        written[target_of(rel)] = reshape_imports(transform(evaluated, rel, present))
    return written


def edit(path, old, new):
    """Replaces `old` in the file `path` by `new`; fails when `old` is not there."""
    text = path.read_text()
    if old not in text:
        sys.exit(f"upstream: {path} has no {old!r} to change: is it kube {KUBE_VERSION}'s?")
    path.write_text(text.replace(old, new, 1))


def apply_manifest_changes(tree, step):
    runtime = tree / "kube-runtime" / "Cargo.toml"
    if step.get("feature"):
        edit(
            runtime,
            'unstable-runtime = ["unstable-runtime-subscribe", "unstable-runtime-stream-control", "unstable-runtime-reconcile-on"]',
            'unstable-runtime = ["unstable-runtime-subscribe", "unstable-runtime-stream-control", "unstable-runtime-reconcile-on", "unstable-runtime-lease"]',
        )
        edit(
            runtime,
            "unstable-runtime-reconcile-on = []\n",
            'unstable-runtime-reconcile-on = []\nunstable-runtime-lease = ["tokio/rt", "tokio/sync"]\n',
        )
        edit(
            tree / "kube-runtime" / "src" / "lib.rs",
            "pub mod finalizer;\n",
            "pub mod finalizer;\n"
            f'#[cfg(feature = "{FEATURE}")]\n'
            f'#[cfg_attr(docsrs, doc(cfg(feature = "{FEATURE}")))]\n'
            "pub mod lease;\n",
        )
    if step.get("dev_deps"):
        edit(
            runtime,
            "dhat.workspace = true\n",
            "dhat.workspace = true\n"
            "# The lease module's Lease API double (all in kube-client's tree already).\n"
            "bytes.workspace = true\n"
            "http.workspace = true\n"
            "http-body.workspace = true\n"
            "http-body-util.workspace = true\n"
            'tower = { workspace = true, features = ["util"] }\n',
        )


# kube-rs formats with nightly rustfmt (`cargo +nightly fmt`: its rustfmt.toml
# sets unstable options), so the series is formatted and checked with one
# pinned nightly's: another nightly may format differently, and the committed
# patches would then be stale on one machine and not on another.
NIGHTLY = "nightly-2026-05-20"
NIGHTLY_RUSTFMT = "1.9.0-nightly (e50aa6fba4 2026-05-19)"


@cache
def nightly():
    """The pinned nightly toolchain's name: itself, or a plain `nightly` that is that one;
    otherwise installed with rustup (rustfmt and clippy)."""
    for toolchain in (NIGHTLY, "nightly"):
        found = subprocess.run(["rustup", "run", toolchain, "rustfmt", "--version"], text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, check=False)
        # With clippy too: the pinned nightly was first installed with rustfmt alone (the
        # install below adds what is missing).
        clippy = subprocess.run(["rustup", "run", toolchain, "cargo-clippy", "--version"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        if found.returncode == 0 and NIGHTLY_RUSTFMT in found.stdout and clippy.returncode == 0:
            return toolchain
    print(f"upstream: installing {NIGHTLY} (kube-rs formats with nightly rustfmt and lints with nightly clippy)",
          flush=True)
    run("rustup", "toolchain", "install", NIGHTLY, "--profile", "minimal", "--component", "rustfmt,clippy")
    return NIGHTLY


def nightly_rustfmt():
    """The pinned nightly's rustfmt, as a command."""
    return ["rustup", "run", nightly(), "rustfmt"]


def rustfmt(tree, paths, *flags):
    """rustfmt as kube-rs runs it (the pinned nightly, its whole rustfmt.toml) on `paths`;
    its exit status."""
    config = tree / "rustfmt.toml"
    result = run(*nightly_rustfmt(), *flags, "--edition", "2024", "--config-path", str(config), *map(str, paths),
                 check=False)
    return result.returncode


def build_series(work):
    """Builds the series in `work`: returns the tree (a git repository)."""
    tool = gen_tool()
    tree = base_tree(work / "kube")
    files = []
    stripped = set()
    for n, step in enumerate(STEPS, 1):
        files += step["files"]
        written = generate_step_files(tree, tool, files, n, stripped)
        lease = tree / "kube-runtime" / "src"
        final = step.get("final", False)
        for target, text in written.items():
            if target == "lease/mod.rs" and not final:
                text = interim_mod(text, written)
            path = lease / target
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        if rustfmt(tree, [lease / t for t in written]) != 0:
            sys.exit("upstream: rustfmt failed on the generated module")
        apply_manifest_changes(tree, step)
        git(tree, "add", "-A")
        git(tree, "commit", "--quiet", "-m", signed_off(step["subject"] + "\n\n" + step["body"]))
    for seam, names in CRATE_ONLY_SEAMS.items():
        missing = [name for name in names if name not in stripped]
        if missing:
            sys.exit(
                f"upstream: the {seam} seam's {', '.join(f'`{m}`' for m in missing)} found nowhere in the crate's "
                "sources that the series carries: renamed or gone? Update CRATE_ONLY_SEAMS in scripts/upstream.py"
            )
    return tree


def generate(dest=PATCHES):
    with tempfile.TemporaryDirectory(prefix="upstream-") as work:
        tree = build_series(Path(work))
        if dest.exists():
            shutil.rmtree(dest)
        dest.mkdir(parents=True)
        git(tree, "format-patch", "--quiet", "--zero-commit", "--no-signature", "--numbered",
            "-o", str(dest), "HEAD~%d" % len(STEPS))
    print(f"upstream: {len(STEPS)} patches in {dest}")
    if dest == PATCHES:
        write_pr_table()


# ---------------------------------------------------------------------------
# The check.


def cargo(tree, *args, target, toolchain=None):
    env = dict(os.environ, CARGO_TARGET_DIR=str(target), RUSTDOCFLAGS="-D warnings")
    env.pop("RUSTFLAGS", None)
    on = ["rustup", "run", toolchain] if toolchain else []
    print("upstream check: " + (f"({toolchain}) " if toolchain else "") + "cargo " + " ".join(args), flush=True)
    run(*on, "cargo", *args, cwd=tree, env=env)


def committed_author():
    """The author of the committed series (its first patch's `From:`)."""
    first = sorted(PATCHES.glob("*.patch"))[0].read_text()
    m = re.search(r"^From: (.*(?:\n [^\n]*)*)$", first, re.M)
    folded = " ".join(m.group(1).split())
    return email.utils.parseaddr(str(email.header.make_header(email.header.decode_header(folded))))


def check():
    global AUTHOR_OVERRIDE
    AUTHOR_OVERRIDE = committed_author()
    identity.cache_clear()
    print(f"upstream check: the series' author, as committed: {AUTHOR_OVERRIDE[0]} <{AUTHOR_OVERRIDE[1]}>")
    with tempfile.TemporaryDirectory(prefix="upstream-check-") as work:
        work = Path(work)
        generate(work / "patches")
        stale = run("diff", "-r", str(PATCHES), str(work / "patches"), check=False, capture=True)
        if stale.returncode != 0:
            print(stale.stdout)
            sys.exit("upstream check: upstream/patches/ is stale: run scripts/upstream.sh generate")
        # One fixed path, so that the cached build of kube's crates stays valid.
        check_pr_text()
        check_conventions()
        tree = CACHE / "check-tree"
        if tree.exists():
            shutil.rmtree(tree)
        base_tree(tree)
        target = CACHE / "check-target"
        patches = sorted(PATCHES.glob("*.patch"))
        on = ["-p", "kube-runtime", "--features", f"{FEATURE},k8s-openapi/latest"]
        off = ["-p", "kube-runtime", "--features", "k8s-openapi/latest"]
        for n, patch in enumerate(patches, 1):
            print(f"upstream check: applying {patch.name}", flush=True)
            git(tree, "am", "--quiet", str(patch))
            imports(tree / "kube-runtime" / "src" / "lease", f"patch {n}")
            # Each patch on its own: kube's lints (lib.rs's clippy table, the
            # workspace's rust lints, clippy.toml) with -D warnings, and the
            # module's tests.
            cargo(tree, "clippy", *on, "--all-targets", "--", "-D", "warnings", target=target)
            cargo(tree, "test", *on, "--lib", "lease::", target=target)
        # The whole series: the feature off, kube-runtime's own tests both
        # ways, the facade, the docs and the formatting.
        cargo(tree, "clippy", *off, "--all-targets", "--", "-D", "warnings", target=target)
        cargo(tree, "test", *on, target=target)
        cargo(tree, "test", *off, target=target)
        # The facade reaches the module through `unstable-runtime` alone: no new `kube` feature.
        cargo(tree, "check", "-p", "kube", "--features", "unstable-runtime,k8s-openapi/latest", target=target)
        rustdoc(tree, target)
        lease = sorted((tree / "kube-runtime" / "src" / "lease").rglob("*.rs"))
        fmt_check(tree, lease)
        # kube-rs lints with nightly clippy too (`cargo +nightly clippy`): its newer lints, on the series.
        cargo(tree, "clippy", *on, "--all-targets", "--", "-D", "warnings", target=CACHE / "nightly-target",
              toolchain=nightly())
        print(f"upstream check: {len(patches)} patches apply, build, test, lint (stable and nightly clippy), "
              "document and format")


def check_conventions():
    """kube's conventions that the build cannot check (scripts/upstream_conventions.py),
    and the crate's own imports in the shape its generated module must have."""
    patches = sorted(PATCHES.glob("*.patch"))
    failed = False
    for kind, passed, found in upstream_conventions.check(patches):
        for f in found:
            print(f"upstream check: {kind}: {f}")
        failed = failed or bool(found)
        if not found:
            print(f"upstream check: {kind}: {passed} ({len(patches)} patches)", flush=True)
    if failed:
        sys.exit("upstream check: the series breaks kube's conventions (above)")
    imports(SRC, "the crate")


def imports(path, what):
    """The imports of the .rs files under `path` in the shape of kube-rs's
    nightly rustfmt options (scripts/upstream_imports.py)."""
    n, files = check_imports([path], label=lambda f: f.relative_to(path))
    if n:
        sys.exit(f"upstream check: {what}: {n} import(s) that kube-rs's nightly rustfmt would merge or regroup (above)")
    print(f"upstream check: {what}: the imports of {files} files are in kube-rs's shape", flush=True)


def rustdoc(tree, target):
    """rustdoc of kube-runtime as docs.rs builds it (unstable-runtime), no warning in the module.

    kube-runtime 5.0.0's own docs have broken links of their own, so
    `-D warnings` on the whole crate would fail before the series: the
    check fails on any warning in src/lease/.
    """
    env = dict(os.environ, CARGO_TARGET_DIR=str(target))
    print("upstream check: cargo doc (no warning in src/lease/)", flush=True)
    out = subprocess.run(
        ["cargo", "doc", "--no-deps", "-p", "kube-runtime", "--features", "unstable-runtime,k8s-openapi/latest"],
        cwd=tree, env=env, text=True, stderr=subprocess.PIPE, check=True,
    ).stderr
    ours = [block for block in out.split("\n\n") if "src/lease/" in block]
    if ours:
        print("\n\n".join(ours))
        sys.exit("upstream check: rustdoc warns in the lease module")


def fmt_check(tree, paths):
    print("upstream check: rustfmt --check (kube-rs's rustfmt.toml, nightly)", flush=True)
    if rustfmt(tree, paths, "--check") != 0:
        sys.exit("upstream check: the lease module is not formatted as kube-rs's rustfmt.toml asks")


def stats(show=True):
    """Each patch's added lines by kind; printed, and returned in order."""
    all_counts = []
    for patch in sorted(PATCHES.glob("*.patch")):
        text = patch.read_text()
        counts = {"code": 0, "docs": 0, "tests": 0, "manifests": 0}
        current = None
        for line in text.split("\n"):
            if line.startswith("+++ b/"):
                current = line[6:]
                continue
            if not line.startswith("+") or line.startswith("+++") or current is None:
                continue
            rel = current.removeprefix("kube-runtime/src/lease/")
            body = line[1:].strip()
            if current.endswith(".toml"):
                counts["manifests"] += 1
            elif TEST_FILES.search(rel):
                counts["tests"] += 1
            elif body.startswith("//"):
                counts["docs"] += 1
            elif body:
                counts["code"] += 1
        total = sum(counts.values())
        if show:
            print(f"{patch.name}: {total} added lines: " + ", ".join(f"{v} {k}" for k, v in counts.items()))
        all_counts.append(counts)
    return all_counts


ROW = re.compile(r"^(\| (\d+)\. .*\| )(\d+) \| (\d+) \| (\d+) \|$", re.M)


def write_pr_table():
    """Writes the sizes `stats` counts into the PR text's table of the patches."""
    doc = ROOT / "docs" / "upstream-proposal.md"
    counts = stats(show=False)

    def row(m):
        c = counts[int(m.group(2)) - 1]
        return f"{m.group(1)}{c['code']} | {c['docs']} | {c['tests']} |"

    doc.write_text(ROW.sub(row, doc.read_text()))


def check_pr_text():
    """The PR text's table of the patches (docs/upstream-proposal.md, section 0) has the sizes stats counts."""
    text = (ROOT / "docs" / "upstream-proposal.md").read_text()
    rows = re.findall(r"^\| (\d+)\. .*\| (\d+) \| (\d+) \| (\d+) \|$", text, re.M)
    want = [(str(n), str(c["code"]), str(c["docs"]), str(c["tests"])) for n, c in enumerate(stats(show=False), 1)]
    if rows != want:
        sys.exit(f"upstream check: docs/upstream-proposal.md's table of patches says {rows}, the series has {want}")


if __name__ == "__main__":
    command = sys.argv[1] if len(sys.argv) > 1 else ""
    CACHE.mkdir(parents=True, exist_ok=True)
    if command == "generate":
        generate()
    elif command == "check":
        check()
    elif command == "stats":
        stats()
    elif command == "check-docs":
        __import__("upstream_docs").check_docs()
    elif command in ("generate-pr1", "check-pr1", "generate-followups", "check-prs", "followup-tree", "followup-save"):
        import upstream_pr

        upstream_pr.main(command, sys.argv[2:])
    else:
        sys.exit(__doc__)
