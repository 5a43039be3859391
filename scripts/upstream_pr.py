#!/usr/bin/env python3
"""Pull request 1 of the upstream series: a small `kube_runtime::lease`, and its follow-ups.

    scripts/upstream.sh generate-pr1   # writes upstream/pr1/0001-*.patch from its sources
    scripts/upstream.sh check-pr1      # fails if the patch is stale, or does not apply,
                                       # lint, test, document and format on kube 5.0.0,
                                       # or is larger than PR1 may be
    scripts/upstream.sh generate-followups   # writes upstream/followups/NN-*/NNNN-*.patch
    scripts/upstream.sh check-prs      # check-pr1, then each follow-up applied in turn and
                                       # checked the same way (at most ~450 added lines
                                       # each); prints the distance from the last
                                       # follow-up to the end state (upstream/patches/)

Its sources are plain files: the new module (upstream/pr1/kube-runtime/src/lease/)
and the diff of kube's own files it changes (upstream/pr1/kube-runtime.diff:
the feature in kube-runtime's Cargo.toml, `pub mod lease` in lib.rs, the
`WatchStreamExt` method). The patch is one commit on kube-rs's tree at 5.0.0
(`base_tree` of scripts/upstream.py), authored and signed off by the
repository's `git config user.name` / `user.email` (`generate-pr1`); the
check regenerates it as the author the committed patch records.

A follow-up is a directory upstream/followups/NN-name/, maintained by hand:
the files of the module it adds or changes, whole (kube-runtime/src/lease/...,
copied over the step before), optionally a `kube-runtime.diff` of kube's own
files, and its pull request text `PR.md`: the commit's subject (`# ...`), its
body (up to the first `## ` heading), and its size row
(`| follow-up N | code | docs | tests | manifests | total |`), which the cover
letter's table of follow-ups repeats. Its patch is one commit on the step
before, written next to it by `generate-followups`.
"""

import email
import email.utils
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import upstream
import upstream_imports
from upstream import CACHE, FEATURE, ROOT, UPSTREAM, base_tree, cargo, fmt_check, git, run, rustdoc

PR1 = UPSTREAM / "pr1"
LEASE = PR1 / "kube-runtime" / "src" / "lease"
EDITS = PR1 / "kube-runtime.diff"
PR_TEXT = ROOT / "docs" / "upstream-pr1.md"
COVER_LETTER = ROOT / "docs" / "upstream-proposal.md"
PR_ROW = re.compile(r"^\| PR 1 \| (\d+) \| (\d+) \| (\d+) \| (\d+) \| (\d+) \|$", re.M)
MAX_CODE = 750
MAX_TOTAL = 1150
FOLLOWUPS = UPSTREAM / "followups"
FOLLOWUP_ROW = re.compile(r"^\| follow-up (\d+) \| (\d+) \| (\d+) \| (\d+) \| (\d+) \| (\d+) \|$", re.M)
MAX_FOLLOWUP = 450

SUBJECT = "runtime: add lease-based leader election (`lease`, unstable)"
BODY = """\
Leader election on a coordination.k8s.io/v1 Lease with client-go's
leaderelection protocol (kube-rs/kube#485), behind the new feature
`unstable-runtime-lease`, which `unstable-runtime` includes:

- `lease::Config`, checked with client-go's rules before any API call;
- `LeaderElector`: one task per Lease gets, creates and replaces the
  Lease with its resourceVersion, renews every retry period within the
  renew deadline (counted from before the request is sent, each request
  bounded by the time left), and releases when the last guard is dropped;
- `LeaseGuard`, a future resolving to `Lost` when the term ends, on its
  own timer at the renew deadline; `is_valid` and `fencing_token`;
- `WatchStreamExt::with_leader_election`: any stream (a Controller's)
  polled only while leading, dropped when the term ends;
- tests on a tower-test mock of the API server, with paused time."""


def author():
    def get(key):
        out = run("git", "-C", str(ROOT), "config", key, capture=True, check=False).stdout.strip()
        if not out:
            sys.exit(f"upstream: `git config {key}` is not set in {ROOT}")
        return out

    return get("user.name"), get("user.email")


def build(tree, who=None):
    """kube 5.0.0 in `tree` with PR1 committed on top, by `who` (default: `author()`)."""
    base_tree(tree)
    shutil.copytree(LEASE, tree / "kube-runtime" / "src" / "lease")
    git(tree, "apply", str(EDITS))
    git(tree, "add", "-A")
    name, address = who or author()
    message = f"{SUBJECT}\n\n{BODY}\n\nSigned-off-by: {name} <{address}>"
    git(tree, "commit", "--quiet", "-m", message, "--author", f"{name} <{address}>")
    return tree


def followups():
    """The follow-ups' directories, in order."""
    return sorted(d for d in FOLLOWUPS.glob("[0-9][0-9]-*") if d.is_dir())


def followup_message(step):
    """The commit message of a follow-up: its PR text's title, and its body up to the first `## `."""
    text = (step / "PR.md").read_text()
    title, _, rest = text.partition("\n")
    if not title.startswith("# "):
        sys.exit(f"upstream: {step.name}/PR.md does not open with its title (`# ...`)")
    body = rest.split("\n## ", 1)[0].strip()
    return title[2:].strip(), body


def build_followups(tree, who=None):
    """The follow-ups committed in turn on `tree` (PR1 committed); their commits, in order."""
    name, address = who or author()
    commits = []
    for step in followups():
        src = step / "kube-runtime"
        for f in sorted(p for p in src.rglob("*") if p.is_file()):
            dest = tree / "kube-runtime" / f.relative_to(src)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(f, dest)
        if (step / "kube-runtime.diff").exists():
            git(tree, "apply", str(step / "kube-runtime.diff"))
        git(tree, "add", "-A")
        subject, body = followup_message(step)
        message = f"{subject}\n\n{body}\n\nSigned-off-by: {name} <{address}>"
        git(tree, "commit", "--quiet", "-m", message, "--author", f"{name} <{address}>")
        commits.append(git(tree, "rev-parse", "HEAD", capture=True).stdout.strip())
    return commits


def generate_followups(dest=FOLLOWUPS, who=None):
    """Writes each follow-up's patch into its directory (under `dest`); returns them in order."""
    patches = []
    with tempfile.TemporaryDirectory(prefix="upstream-followups-") as work:
        tree = build(Path(work) / "kube", who)
        for n, (step, commit) in enumerate(zip(followups(), build_followups(tree, who)), 2):
            out = dest / step.name
            out.mkdir(parents=True, exist_ok=True)
            for old in out.glob("*.patch"):
                old.unlink()
            git(tree, "format-patch", "--quiet", "--zero-commit", "--no-signature", "--start-number", str(n),
                "-o", str(out), "-1", commit)
            patches.append(next(out.glob("*.patch")))
    return patches


def generate(dest=PR1, who=None):
    with tempfile.TemporaryDirectory(prefix="upstream-pr1-") as work:
        tree = build(Path(work) / "kube", who)
        for old in dest.glob("*.patch"):
            old.unlink()
        git(tree, "format-patch", "--quiet", "--zero-commit", "--no-signature", "-o", str(dest), "HEAD~1")
    return next(dest.glob("*.patch"))


def sizes(patch):
    """PR1's added lines by kind, counted as `scripts/upstream.sh stats` counts a patch."""
    with tempfile.TemporaryDirectory(prefix="upstream-pr1-stats-") as d:
        shutil.copy(patch, d)
        saved, upstream.PATCHES = upstream.PATCHES, Path(d)
        try:
            [counts] = upstream.stats(show=False)
        finally:
            upstream.PATCHES = saved
    return counts


def check_pr_text(counts):
    """The size row of the PR text and of the series' cover letter is what the patch adds."""
    want = [str(counts[k]) for k in ("code", "docs", "tests", "manifests")] + [str(sum(counts.values()))]
    for text in (PR_TEXT, COVER_LETTER):
        rows = PR_ROW.findall(text.read_text())
        if rows != [tuple(want)]:
            sys.exit(f"upstream check-pr1: {text.name}'s size row of PR 1 says {rows}, the patch adds {want}")


def recorded_author(patch):
    return email.utils.parseaddr(email.message_from_string(patch.read_text())["From"])


def check_fresh(label):
    """PR1's patch (and, for `check-prs`, each follow-up's) is what its sources make."""
    committed = sorted(PR1.glob("*.patch"))
    if len(committed) != 1:
        sys.exit(f"upstream {label}: no single upstream/pr1/*.patch: run scripts/upstream.sh generate-pr1")
    # Regenerated as its recorded author, so that the check passes in any clone.
    who = recorded_author(committed[0])
    with tempfile.TemporaryDirectory(prefix="upstream-pr1-check-") as work:
        fresh = generate(Path(work), who)
        if [p.name for p in committed] != [fresh.name] or committed[0].read_text() != fresh.read_text():
            sys.exit(f"upstream {label}: upstream/pr1/*.patch is stale: run scripts/upstream.sh generate-pr1")
    if label == "check-pr1":
        return committed
    steps = []
    for step in followups():
        found = sorted(step.glob("*.patch"))
        if len(found) != 1:
            sys.exit(f"upstream {label}: no single patch in {step.relative_to(ROOT)}: "
                     "run scripts/upstream.sh generate-followups")
        steps.append(found[0])
    with tempfile.TemporaryDirectory(prefix="upstream-followups-check-") as work:
        fresh = generate_followups(Path(work), who)
        for patch, new in zip(steps, fresh):
            if patch.name != new.name or patch.read_text() != new.read_text():
                sys.exit(f"upstream {label}: {patch.relative_to(ROOT)} is stale: "
                         "run scripts/upstream.sh generate-followups")
    return committed + steps


def check_step(tree, target, label, what):
    """One pull request applied: kube's lints with the feature on and off, the module's tests
    and doc tests, the facade, rustdoc, rustfmt and the import shape."""
    print(f"upstream {label}: {what}: lint, test, document, format", flush=True)
    on = ["-p", "kube-runtime", "--features", f"{FEATURE},k8s-openapi/latest"]
    off = ["-p", "kube-runtime", "--features", "k8s-openapi/latest"]
    for features in (on, off):
        cargo(tree, "clippy", *features, "--all-targets", "--", "-D", "warnings", target=target)
    cargo(tree, "test", *on, "--lib", "lease::", target=target)
    cargo(tree, "test", *on, "--doc", "lease", target=target)
    # The facade reaches the module through `unstable-runtime` alone: no new `kube` feature.
    cargo(tree, "check", "-p", "kube", "--features", "unstable-runtime,k8s-openapi/latest", target=target)
    rustdoc(tree, target)
    runtime = tree / "kube-runtime" / "src"
    fmt_check(tree, sorted((runtime / "lease").rglob("*.rs")) + [runtime / "utils" / "watch_ext.rs"])
    problems = [
        f"{f.name}:{line}: {message}"
        for f in sorted((runtime / "lease").rglob("*.rs"))
        for line, message in upstream_imports.problems(f.read_text())
    ]
    if problems:
        sys.exit(f"upstream {label}: {what}: imports as kube's nightly rustfmt would not leave them:\n"
                 + "\n".join(problems))


def row_of(counts):
    return [str(counts[k]) for k in ("code", "docs", "tests", "manifests")] + [str(sum(counts.values()))]


def check_followup_rows(all_counts):
    """Each follow-up's PR text has its size row, and the cover letter the rows of them all."""
    want = [(str(n), *row_of(c)) for n, c in enumerate(all_counts, 1)]
    for n, step in enumerate(followups(), 1):
        rows = FOLLOWUP_ROW.findall((step / "PR.md").read_text())
        if rows != [want[n - 1]]:
            sys.exit(f"upstream check-prs: {step.name}/PR.md's size row says {rows}, the patch adds {[want[n - 1]]}")
    rows = FOLLOWUP_ROW.findall(COVER_LETTER.read_text())
    if rows != want:
        sys.exit(f"upstream check-prs: {COVER_LETTER.name}'s rows of the follow-ups say {rows}, the patches add {want}")


def distance_to_end_state(tree):
    """Information: the lines between the module after the last follow-up and the module the
    generated series (upstream/patches/) makes, both on kube-rs 5.0.0."""
    with tempfile.TemporaryDirectory(prefix="upstream-end-state-") as work:
        end = base_tree(Path(work) / "kube")
        for patch in sorted(upstream.PATCHES.glob("*.patch")):
            git(end, "am", "--quiet", str(patch))
        ours, theirs = tree / "kube-runtime" / "src" / "lease", end / "kube-runtime" / "src" / "lease"
        out = run("git", "diff", "--no-index", "--numstat", str(ours), str(theirs), capture=True, check=False).stdout
        added = removed = tests = 0
        rows = []
        for line in out.splitlines():
            a, r, name = line.split("\t", 2)
            if a == "-":
                continue
            sides = [n for n in name.replace("{", "").replace("}", "").split(" => ") if not n.endswith("dev/null")]
            name = re.sub(r"^.*?/src/lease/", "", sides[-1])
            added, removed = added + int(a), removed + int(r)
            tests += int(a) if upstream.TEST_FILES.search(name) else 0
            rows.append(f"    {name}: +{a} -{r}")
        print("upstream check-prs: distance from the last follow-up to the end state (information): "
              f"{added} lines to add ({tests} of them in test files), {removed} to remove in src/lease/ "
              f"({len(rows)} files differ)")
        print("\n".join(rows), flush=True)


def check(label="check-pr1"):
    patches = check_fresh(label)
    # The same tree and target as `check`, so that kube's crates stay built.
    tree = CACHE / "check-tree"
    if tree.exists():
        shutil.rmtree(tree)
    base_tree(tree)
    target = CACHE / "check-target"
    followup_counts = []
    for n, patch in enumerate(patches):
        what = "PR1" if n == 0 else f"follow-up {n}"
        print(f"upstream {label}: applying {patch.name} ({what})", flush=True)
        git(tree, "am", "--quiet", str(patch))
        check_step(tree, target, label, what)
        counts = sizes(patch)
        total = sum(counts.values())
        print(f"upstream {label}: {what}: {patch.name}: {total} added lines: "
              + ", ".join(f"{v} {k}" for k, v in counts.items()), flush=True)
        if n == 0:
            if counts["code"] > MAX_CODE or total > MAX_TOTAL:
                sys.exit(f"upstream {label}: PR1 is too large (at most {MAX_CODE} lines of code, {MAX_TOTAL} in all)")
            check_pr_text(counts)
        else:
            if total > MAX_FOLLOWUP:
                sys.exit(f"upstream {label}: {what} is too large ({total} added lines; at most {MAX_FOLLOWUP})")
            followup_counts.append(counts)
    if label == "check-pr1":
        print("upstream check-pr1: PR1 applies, lints, tests, documents and formats, within its size")
        return
    check_followup_rows(followup_counts)
    distance_to_end_state(tree)
    print(f"upstream check-prs: PR1 and {len(followup_counts)} follow-up(s) apply in turn, lint, test, "
          "document and format, each within its size")


def main(command):
    try:
        if command == "generate-pr1":
            print(f"upstream: {generate().relative_to(ROOT)}")
        elif command == "check-pr1":
            check()
        elif command == "generate-followups":
            for patch in generate_followups():
                print(f"upstream: {patch.relative_to(ROOT)}")
        elif command == "check-prs":
            check("check-prs")
    except subprocess.CalledProcessError as e:
        sys.exit(f"upstream {command}: failed: {' '.join(map(str, e.cmd))}")


if __name__ == "__main__":
    CACHE.mkdir(parents=True, exist_ok=True)
    main(sys.argv[1] if len(sys.argv) > 1 else "")
