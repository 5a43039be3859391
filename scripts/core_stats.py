#!/usr/bin/env python3
"""The size and shape of the crate's core, against the redesign's targets.

    scripts/core-stats.sh            # a table per file, the totals, the targets
    scripts/core-stats.sh --check    # the same, failing when a target is missed

The core is what the upstream series carries (scripts/upstream.py): the
configuration, the record rules, the term, the guard, the errors, the elector
without its extras, and the stream and Controller adapters. Its test files are
not counted.

A code line is a line that is neither blank nor a comment (doc comments
included), counted with the extras' features off: an item under a positive
`#[cfg(feature = ...)]` or `#[cfg(any(feature = ...))]` is left out, as is
anything under `#[cfg(test)]`. A feature cfg is any `cfg(...)` or
`cfg_attr(...)` that names a feature (`#[cfg(test)]` is not counted).
"""

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "kube-runtime-lease" / "src"

CORE = [
    "lib.rs",
    "config/mod.rs", "config/error.rs", "config/names.rs",
    "record.rs", "error.rs", "term.rs", "guard.rs",
    "elector/mod.rs", "elector/acquire.rs", "elector/api.rs",
    "elector/memory.rs", "elector/observer.rs", "elector/status.rs", "elector/supervise.rs",
    "elector/task/mod.rs", "elector/task/campaign.rs", "elector/task/end.rs",
    "elector/task/lead.rs", "elector/task/renew.rs", "elector/task/view.rs",
    "lease_observer.rs",
    "stream.rs", "stream/each_term.rs", "controller/mod.rs", "scope.rs",
]

# Where the extras attach (the extras' side of the seam: each hook's forms,
# one per feature set, with its `cfg`). The core calls them unconditionally;
# they are printed apart from the core's figures, not counted in them.
ATTACHMENT = ["config/extras.rs", "elector/extras.rs"]

TARGETS = {"core code lines": 2000, "largest core file": 300, "feature cfgs": 15}

CFG = re.compile(r"\bcfg(_attr)?\s*\(")
# An attribute that removes the item after it when the extras are off (or in
# a non-test build).
DROPS_ITEM = re.compile(r"^\s*#\[cfg\((test|feature\s*=|any\(\s*feature\s*=|all\(\s*feature\s*=)")


def _strip_comments(text: str) -> list[str]:
    """Lines with `//` comments removed (outside strings, roughly) and block
    comments gone; good enough for this code base's style."""
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return ["" if line.lstrip().startswith("//") else line for line in text.splitlines()]


def _join_attributes(lines: list[str]) -> tuple[list[str], list[int]]:
    """An attribute written over several lines (`#[cfg_attr(` ... `)]`) joined
    onto its first line, the others left blank, so that its predicate is read
    whole; with each line's weight, the physical code lines it stands for."""
    out: list[str] = []
    weights: list[int] = []
    open_attr = None  # the index in `out` of an attribute still open
    depth = 0
    for line in lines:
        stripped = line.strip()
        if open_attr is not None:
            out[open_attr] += " " + stripped
            weights[open_attr] += 1 if stripped else 0
            out.append("")
            weights.append(0)
        else:
            out.append(line)
            weights.append(1 if stripped else 0)
            if not stripped.startswith("#"):
                continue
            open_attr, depth = len(out) - 1, 0
        depth += stripped.count("[") - stripped.count("]")
        if depth <= 0:
            open_attr = None
    return out, weights


def _feature_cfgs(line: str) -> int:
    """How many `cfg(...)` / `cfg_attr(...)` on `line` name a feature."""
    n = 0
    for m in CFG.finditer(line):
        depth, j = 1, m.end()
        while j < len(line) and depth:
            depth += {"(": 1, ")": -1}.get(line[j], 0)
            j += 1
        inner = line[m.end():j]
        # The predicate only: a cfg_attr's attribute may mention anything.
        if m.group(1):
            inner = inner.split(",", 1)[0] if not inner.startswith(("any", "all", "not")) else inner
        if re.search(r"\bfeature\s*=", inner):
            n += 1
    return n


def _skip_item(lines: list[str], i: int) -> int:
    """The index after the item starting at line `i` (its attributes first)."""
    depth = 0
    seen_brace = False
    while i < len(lines):
        line = lines[i]
        # Strings with braces are rare here; ignore them.
        for ch in line:
            if ch in "{([":
                depth += 1
                seen_brace = seen_brace or ch == "{"
            elif ch in "})]":
                depth -= 1
        i += 1
        s = line.strip()
        if depth <= 0 and not s.startswith("#[") and (s.endswith(";") or s.endswith("}") or s.endswith(",")):
            return i
        if depth <= 0 and seen_brace:
            return i
    return i


# What an attribute stands on: a definition (a module, an import, an item, a
# field or an enum variant), or else a statement or expression (a call site).
DEFINITION = re.compile(
    r"^\s*(pub(\([^)]*\))?\s+)?((async\s+)?fn|mod|use|impl|struct|enum|type|const|static|trait)\b"
    r"|^\s*(pub(\([^)]*\))?\s+)?[a-z_][a-z0-9_]*\s*:\s*[^:=]"  # a field (not `let`, not a path)
    r"|^\s*[A-Z][A-Za-z0-9]*\s*([({,]|$)"  # an enum variant
)


FN = re.compile(r"\bfn\s+\w+")


def call_site_cfgs(lines: list[str]) -> int:
    """Feature cfgs on a statement or an expression (anything inside a
    function's body, a struct literal's field included) rather than on a
    definition. Rough: braces are counted without reading strings."""
    n = 0
    depth = 0
    bodies: list[int] = []  # the depth at which each open function body began
    pending_fn = False
    for i, line in enumerate(lines):
        k = _feature_cfgs(line)
        if k and not line.strip().startswith("#!"):
            j = i + 1
            while j < len(lines) and (not lines[j].strip() or lines[j].strip().startswith("#[")):
                j += 1
            target = lines[j] if j < len(lines) else ""
            if bodies or not DEFINITION.match(target):
                n += k
        if FN.search(line) and not line.strip().startswith("#"):
            pending_fn = True
        for ch in line:
            if ch == "{":
                if pending_fn:
                    bodies.append(depth)
                    pending_fn = False
                depth += 1
            elif ch == "}":
                depth -= 1
                if bodies and depth == bodies[-1]:
                    bodies.pop()
        if pending_fn and line.rstrip().endswith(";"):
            pending_fn = False  # a declaration without a body
    return n


def code_lines(path: Path) -> tuple[int, int, int]:
    """(code lines with the extras off, feature cfgs, of them at call sites)."""
    lines, weights = _join_attributes(_strip_comments(path.read_text()))
    cfgs = sum(_feature_cfgs(l) for l in lines)
    calls = call_site_cfgs(lines)
    count = 0
    i = 0
    while i < len(lines):
        line = lines[i]
        if DROPS_ITEM.match(line) and "not(" not in line.split("cfg(", 1)[1][:5]:
            i = _skip_item(lines, i + 1)
            continue
        count += weights[i]
        i += 1
    return count, cfgs, calls


def main() -> int:
    check = "--check" in sys.argv[1:]
    rows = []
    for rel in CORE:
        path = SRC / rel
        if not path.exists():
            continue
        n, cfgs, calls = code_lines(path)
        rows.append((rel, n, cfgs, calls))
    width = max(len(r[0]) for r in rows)
    print(f"{'file':<{width}}  code  feature-cfgs  at-call-sites")
    for rel, n, cfgs, calls in sorted(rows, key=lambda r: -r[1]):
        print(f"{rel:<{width}}  {n:>4}  {cfgs:>12}  {calls:>13}")
    total = sum(r[1] for r in rows)
    largest = max(rows, key=lambda r: r[1])
    cfgs = sum(r[2] for r in rows)
    measured = {
        "core code lines": total,
        "largest core file": largest[1],
        "feature cfgs": cfgs,
    }
    print()
    missed = []
    for name, target in TARGETS.items():
        value = measured[name]
        ok = value <= target
        note = f" ({largest[0]})" if name == "largest core file" else ""
        print(f"{name:<18} {value:>5}{note}  target <= {target}  {'ok' if ok else 'MISSED'}")
        if not ok:
            missed.append(name)
    raw = sum(
        1
        for rel in CORE
        if (SRC / rel).exists()
        for line in (SRC / rel).read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("//")
    )
    print(f"  the same files by a plain `grep -vE '^\\s*$|^\\s*//'` (the extras' items, `#[cfg(test)]` lines and "
          f"block comments kept in): {raw}")
    calls = sum(r[3] for r in rows)
    print(f"  of the feature cfgs, inside a function's body (a call site): {calls}; "
          f"the rest stand on definitions (a module, an import, an item, a field, a variant)")
    attached = [code_lines(SRC / rel) for rel in ATTACHMENT if (SRC / rel).exists()]
    print(f"  the extras' attachment ({', '.join(ATTACHMENT)}; not counted above): "
          f"{sum(a[0] for a in attached)} code lines with the extras off, {sum(a[1] for a in attached)} feature cfgs "
          f"({sum(a[2] for a in attached)} inside a function's body)")
    if check and missed:
        print(f"targets missed: {', '.join(missed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
