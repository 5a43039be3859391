#!/usr/bin/env python3
"""Pull request 1 of the upstream series: a small `kube_runtime::lease`, and its follow-ups.

    scripts/upstream.sh generate-pr1   # writes upstream/pr1/0001-*.patch from its sources
    scripts/upstream.sh check-pr1      # fails if the patch is stale, or does not apply,
                                       # lint, test, document and format on kube 5.0.0,
                                       # or is larger than PR1 may be
    scripts/upstream.sh check-prs      # check-pr1, then each follow-up applied in turn and
                                       # checked the same way (at most ~450 added lines
                                       # each); prints the distance from the last
                                       # follow-up to the end state (upstream/patches/)
    scripts/upstream.sh followup-tree N DIR   # PR1 and follow-ups 1..N in DIR, a new git
                                       # repository: kube 5.0.0, then one commit per step
    scripts/upstream.sh followup-save N DIR   # follow-up N's patch, from step N of DIR
    scripts/upstream.sh generate-followups   # rewrites each follow-up's patch in its
                                       # canonical form (message from PR.md, index lines)

Its sources are plain files: the new module (upstream/pr1/kube-runtime/src/lease/)
and the diff of kube's own files it changes (upstream/pr1/kube-runtime.diff:
the feature in kube-runtime's Cargo.toml, `pub mod lease` in lib.rs, the
`WatchStreamExt` method). The patch is one commit on kube-rs's tree at 5.0.0
(`base_tree` of scripts/upstream.py), authored and signed off by the
repository's `git config user.name` / `user.email` (`generate-pr1`); the
check regenerates it as the author the committed patch records.

A follow-up is a directory upstream/followups/NN-name/ holding two files kept
by hand: its change over the step before (PR1 for follow-up 1, follow-up
N-1 for follow-up N) as one patch, `NNNN-*.patch`, and its pull request
text `PR.md`: the commit's subject (`# ...`), its body (up to the first `## `
heading), and its size row
(`| follow-up N | code | docs | tests | manifests | total |`), which the cover
letter's table of follow-ups repeats. The series is PR1's files, then each
follow-up's patch applied in turn (`git apply`), one commit per step.

The patch is the source, and the only copy of the follow-up's code: the
mailbox patch, rather than a plain diff beside a patch made from it, so that
what `check-prs` applies is the file kept by hand, nothing is stored twice,
and staleness is one comparison. Its form is canonical: the commit message is
`PR.md`'s, signed off, and the `index` lines are those of the step before.
`generate-followups` rewrites every patch in that form (after `PR.md` or an
earlier step changed, or a patch was edited by hand); `check-prs` fails when
one is not, or when one does not apply on the step before, naming it.

To edit follow-up N as a commit rather than as a patch:

    scripts/upstream.sh followup-tree N /tmp/fu    # kube 5.0.0, PR1, follow-ups 1..N
    # edit /tmp/fu, then `git add -A` and `git commit --amend` there (the message is PR.md's anyway)
    scripts/upstream.sh followup-save N /tmp/fu    # writes follow-up N's patch

`followup-save N DIR` takes DIR's commit of step N (the N+2nd of its
history: kube, PR1, follow-up 1, ...) and its diff over the commit before,
which must be the stored series' follow-up N-1 (save earlier steps first),
and then rewrites the later follow-ups' patches over it, or names the first
that no longer applies. To change an earlier step with the later ones on top,
`followup-tree` the last one, `git rebase -i` in DIR, then `followup-save`
each changed step in order. A follow-up that does not apply on the step
before stops `followup-tree` at it, with what applies in DIR's work tree and
the rest in `*.rej` files: fix, commit, and `followup-save` it.
"""

import collections
import email
import email.utils
import re
import shutil
import subprocess
import sys
import tempfile
from contextlib import contextmanager
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
# A follow-up's size row; the cover letter's rows end with a column saying what it adds.
FOLLOWUP_ROW = re.compile(r"^\| follow-up (\d+) \| (\d+) \| (\d+) \| (\d+) \| (\d+) \| (\d+) \|(?: [^|\n]+ \|)?$", re.M)
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


def followup_patch(step):
    """A follow-up's one patch: its change over the step before, the source kept by hand."""
    found = sorted(step.glob("*.patch"))
    if len(found) != 1:
        sys.exit(f"upstream: no single patch in {step.relative_to(ROOT)} (its change over the step before)")
    return found[0]


def step_name(n):
    return "PR1" if n == 0 else f"follow-up {n}"


@contextmanager
def blame(label, what, patch):
    """A failure inside names the step it broke at."""
    try:
        yield
    except subprocess.CalledProcessError as e:
        sys.exit(f"upstream {label}: {what} ({patch.name}) broke: {' '.join(map(str, e.cmd))} failed")
    except SystemExit as e:
        if e.code in (None, 0):
            raise
        sys.exit(f"{e.code}\nupstream {label}: {what} ({patch.name}) broke")


def commit_followup(tree, step, who):
    """The change staged in `tree`, committed with `step`'s PR text as its message; the commit."""
    name, address = who
    subject, body = followup_message(step)
    message = f"{subject}\n\n{body}\n\nSigned-off-by: {name} <{address}>"
    git(tree, "commit", "--quiet", "-m", message, "--author", f"{name} <{address}>")
    return git(tree, "rev-parse", "HEAD", capture=True).stdout.strip()


def build_followups(tree, upto=None, who=None, reject=False):
    """Follow-ups 1..`upto` (default: all) applied and committed in turn on `tree` (PR1 committed);
    their commits, in order. One that does not apply stops the build, naming it; with `reject`,
    what applies of it is left in the work tree and the rest in `*.rej` files."""
    who = who or author()
    commits = []
    for n, step in enumerate(followups()[:upto], 1):
        patch = followup_patch(step)
        try:
            git(tree, "apply", "--index", str(patch))
        except subprocess.CalledProcessError:
            if reject:
                run("git", "apply", "--reject", str(patch), cwd=tree, check=False)
            sys.exit(f"upstream: {step_name(n)} ({patch.relative_to(ROOT)}) does not apply on {step_name(n - 1)}")
        commits.append(commit_followup(tree, step, who))
    return commits


def write_followup(tree, commit, n, dest):
    """Follow-up n's patch from `commit` of `tree`, into `dest`/NN-name/ (replacing the one there)."""
    out = dest / followups()[n - 1].name
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.patch"):
        old.unlink()
    git(tree, "format-patch", "--quiet", "--zero-commit", "--no-signature", "--start-number", str(n + 1),
        "-o", str(out), "-1", commit)
    return next(out.glob("*.patch"))


def generate_followups(dest=FOLLOWUPS, who=None):
    """Each follow-up's patch in its canonical form, into its directory under `dest` (in place
    by default: every patch is applied before any is written); returns them in order."""
    with tempfile.TemporaryDirectory(prefix="upstream-followups-") as work:
        tree = build(Path(work) / "kube", who)
        commits = build_followups(tree, who=who)
        return [write_followup(tree, commit, n, dest) for n, commit in enumerate(commits, 1)]


def tree_of(repo, commit):
    return git(repo, "rev-parse", f"{commit}^{{tree}}", capture=True).stdout.strip()


def step_number(text, steps):
    if not text.isdigit() or not 1 <= int(text) <= len(steps):
        sys.exit(f"upstream: no follow-up {text}: there are {len(steps)} (upstream/followups/)")
    return int(text)


def followup_tree(n, dest):
    """PR1 and follow-ups 1..n in `dest`, a new git repository: kube 5.0.0, then one commit per step."""
    n = step_number(n, followups())
    dest = Path(dest).resolve()
    if dest.exists() and any(dest.iterdir()):
        sys.exit(f"upstream followup-tree: {dest} exists and is not empty")
    if dest.exists():
        dest.rmdir()
    build(dest)
    build_followups(dest, n, reject=True)
    print(git(dest, "log", "--oneline", capture=True).stdout, end="")
    steps = "follow-up 1" if n == 1 else f"follow-ups 1..{n}"
    print(f"upstream followup-tree: {dest}: PR1 and {steps}; after editing and committing "
          f"follow-up {n}: scripts/upstream.sh followup-save {n} {dest}")


def followup_save(n, src):
    """Follow-up n's patch, written from `src` (a tree of `followup-tree`): the diff of its
    step n over its step n-1, which must be the stored series' step n-1; then the later
    follow-ups rewritten over it, or the first that no longer applies named."""
    steps = followups()
    n = step_number(n, steps)
    src = Path(src).resolve()
    history = git(src, "rev-list", "--first-parent", "--reverse", "HEAD", capture=True).stdout.split()
    if len(history) < n + 2:
        sys.exit(f"upstream followup-save: {src} has no follow-up {n}: its commits are kube 5.0.0, "
                 f"PR1 and {len(history) - 2} follow-up(s)")
    before, after = history[n], history[n + 1]
    who = author()
    with tempfile.TemporaryDirectory(prefix="upstream-followup-save-") as work:
        tree = build(Path(work) / "kube", who)
        build_followups(tree, n - 1, who)
        if tree_of(src, before) != tree_of(tree, "HEAD"):
            sys.exit(f"upstream followup-save: {src}'s {step_name(n - 1)} ({before[:12]}) is not the "
                     f"stored series' {step_name(n - 1)}: save the earlier follow-ups first")
        diff = Path(work) / "changes.diff"
        # Whatever the user's diff settings: the a/ b/ prefixes `git apply` expects.
        out = git(src, "diff", "--binary", "--no-ext-diff", "--no-color", "--src-prefix=a/", "--dst-prefix=b/",
                  before, after, capture=True).stdout
        diff.write_text(out)
        if not out:
            sys.exit(f"upstream followup-save: {src}'s follow-up {n} ({after[:12]}) changes nothing")
        git(tree, "apply", "--index", str(diff))
        patch = write_followup(tree, commit_followup(tree, steps[n - 1], who), n, FOLLOWUPS)
        print(f"upstream: {patch.relative_to(ROOT)}")
    if n < len(steps):
        try:
            patches = generate_followups(who=who)
        except SystemExit as e:
            sys.exit(f"{e.code}\nupstream followup-save: follow-up {n} is saved, the later ones are not rewritten: "
                     "fix the one named in a `followup-tree` of it (which stops there, with `*.rej` files), "
                     "or save it from DIR if DIR carries it")
        for patch in patches:
            print(f"upstream: {patch.relative_to(ROOT)}")


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
    steps = [followup_patch(step) for step in followups()]
    with tempfile.TemporaryDirectory(prefix="upstream-followups-check-") as work:
        fresh = generate_followups(Path(work), who)
        for n, (patch, new) in enumerate(zip(steps, fresh), 1):
            if patch.name != new.name or patch.read_text() != new.read_text():
                sys.exit(f"upstream {label}: {step_name(n)}: {patch.relative_to(ROOT)} is not in its canonical "
                         "form (message from PR.md, index lines of the step before): "
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
        # The same distance with lines that only moved (to another file or place) left out:
        # what is new content, apart from the layout.
        for kind, is_test in (("code and docs", False), ("tests", True)):
            a, b = line_counts(ours, is_test), line_counts(theirs, is_test)
            print(f"upstream check-prs: content still to go in {kind}, moved lines left out: "
                  f"{sum((b - a).values())} to add, {sum((a - b).values())} to remove "
                  f"(the last follow-up has {sum(a.values())} non-blank lines, the end state {sum(b.values())})",
                  flush=True)


def line_counts(root, tests):
    """The non-blank lines (stripped) of the module's test files, or of its other files, as a
    multiset: two trees compared this way differ only in what was written, not where."""
    counts = collections.Counter()
    for path in sorted(root.rglob("*.rs")):
        if bool(upstream.TEST_FILES.search(str(path.relative_to(root)))) == tests:
            counts.update(line.strip() for line in path.read_text().splitlines() if line.strip())
    return counts


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
        what = step_name(n)
        print(f"upstream {label}: applying {patch.name} ({what})", flush=True)
        with blame(label, what, patch):
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


def main(command, args=()):
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
        elif command in ("followup-tree", "followup-save"):
            if len(args) != 2:
                sys.exit(f"usage: scripts/upstream.sh {command} N DIR")
            (followup_tree if command == "followup-tree" else followup_save)(*args)
    except subprocess.CalledProcessError as e:
        sys.exit(f"upstream {command}: failed: {' '.join(map(str, e.cmd))}")


if __name__ == "__main__":
    CACHE.mkdir(parents=True, exist_ok=True)
    main(sys.argv[1] if len(sys.argv) > 1 else "", sys.argv[2:])
