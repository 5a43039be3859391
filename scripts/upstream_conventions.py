"""kube-rs's conventions that the series' build cannot check, checked on the
patches' text (scripts/upstream.py's `check` runs them):

- every commit is signed off (the DCO) by its author: a `Signed-off-by:`
  line equal to the patch's `From:`;
- no patch adds `dead_code` (an allow of it, or an expectation), on any
  added line: each patch's crate-private items are used in that patch
  (scripts/upstream.py's STEPS bring an item with the patch that uses it),
  and the code that only the crate's extras use (the observer seam) is
  stripped by the generator (scripts/upstream.py's CRATE_ONLY_SEAMS);
- the module's docs (`///` and `//!` lines the patches add) name only
  kube's own things: not this repository, its files, its test harness, or
  the features and extras that stay outside kube.
"""

import re
from pathlib import Path

# What kube does not have, as the module's docs would name it: (pattern, why).
NOT_KUBES = [
    (r"\bthis crate\b|\bthe crate's\b", "\"this crate\": in kube it is a module of kube-runtime"),
    (r"kube[-_]runtime[-_]lease", "the crate's name"),
    (r"\b(BENCHMARKS|ARCHITECTURE|RELIABILITY|CHANGELOG)\.md\b", "a file of this repository"),
    (r"(^|[\s`(])(examples|docs|bench|harness|deploy|demo|scripts)/", "a directory of this repository"),
    (r"\brepository's\b", "this repository"),
    (r"(?<!tokio`'s `)\btest-util\b", "the `test-util` feature (kube has none for this module)"),
    (r"\bharness\b", "the repository's test harness"),
    (r"\bsimulation\b", "the repository's simulation"),
    (r"\bwarm[- ]standby\b|\bWarmController\b", "the warm-standby extra"),
    (r"\bshards?\b|\bsharded\b|\bShardedElector\b", "the shards extra"),
    (r"\bmetrics\b|\bprometheus\b|\bLeaseMetrics\b|\bwith_metrics\b", "the metrics extra"),
    (r"\bKubernetes Events\b|\bwith_events\b|\bits Event\b", "the events extra"),
    (r"\bOwnerReference\b|\bowner[ _]reference\b", "the lease-metadata extra"),
    (r"\bextras\b|\b(an|the|[a-z]+-[a-z-]+) extra\b", "the crate's extras"),
]


def added(patch_text):
    """(file, line) of each line the patch adds."""
    current = None
    for line in patch_text.split("\n"):
        if line.startswith("+++ "):
            current = line[6:] if line.startswith("+++ b/") else None
            continue
        if current and line.startswith("+") and not line.startswith("+++"):
            yield current, line[1:]


def header(patch_text, name):
    m = re.search(rf"^{name}: (.*(?:\n [^\n]*)*)$", patch_text, re.M)
    return " ".join(m.group(1).split()) if m else None


def sign_off_problems(patches):
    out = []
    for p in patches:
        text = p.read_text()
        author = header(text, "From")
        message = text.split("\n---\n", 1)[0]
        signed = re.findall(r"^Signed-off-by: (.*)$", message, re.M)
        if not author or author not in signed:
            out.append(f"{p.name}: no `Signed-off-by: {author}` (its author) in the commit message")
    return out


def dead_code_problems(patches):
    out = []
    for p in patches:
        for f, line in added(p.read_text()):
            if "dead_code" in line:
                out.append(f"{p.name}: {f}: adds {line.strip()!r}")
    return out


def doc_problems(patches):
    out = []
    for p in patches:
        for f, line in added(p.read_text()):
            if not f.endswith(".rs"):
                continue
            m = re.match(r"\s*//[/!](.*)$", line)
            if not m:
                continue
            for pattern, why in NOT_KUBES:
                hit = re.search(pattern, m.group(1), re.I if pattern.islower() else 0)
                if hit:
                    out.append(f"{p.name}: {f}: names {hit.group(0).strip()!r} ({why}): {m.group(1).strip()}")
    return out


def check(patches):
    """Every problem of `patches` (paths of .patch files), by check: (what
    is checked, what it says when it passes, the problems found)."""
    return [
        ("sign-off", "each commit signed off by its author", sign_off_problems(patches)),
        ("dead code", "no patch adds any `dead_code` (no allow, no expect)",
         dead_code_problems(patches)),
        ("docs", "the module's docs name only kube's things", doc_problems(patches)),
    ]


if __name__ == "__main__":
    import sys

    paths = sorted(Path(sys.argv[1]).glob("*.patch")) if len(sys.argv) > 1 else []
    for kind, passed, found in check(paths):
        for f in found:
            print(f"{kind}: {f}")
        if not found:
            print(f"{kind}: {passed}")
