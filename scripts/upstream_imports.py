#!/usr/bin/env python3
"""The shape of `use` items that kube-rs's nightly rustfmt options ask for,
checked (and, for the generated series, made) without nightly rustfmt.

    python3 scripts/upstream_imports.py check PATH...   # files or directories of .rs files

kube-rs's rustfmt.toml sets `imports_granularity = "Crate"`: rustfmt merges
the `use` items of one crate root (`std`, `futures`, `crate`, `self`,
`super`, ...) into one item. It merges only items of the same visibility
(`use` apart from `pub use` and `pub(crate) use`), never an item with
attributes (`#[cfg(test)] use ...`) or with a comment (rustfmt's
`UseTree::share_prefix` in src/imports.rs). kube-rs sets no `group_imports`;
with its default, `Preserve`, rustfmt merges only within a block of items
not separated by a blank line (`ReorderableItemKind::in_group` in
src/reorder.rs), and with `StdExternalCrate` across the whole run of `use`
items (blank lines and comments between them). This crate and its
generated series keep the `StdExternalCrate` shape, stricter than kube-rs
asks: `std`/`core`/`alloc`, then external crates, then `crate`/`self`/
`super`, each group one block separated by a blank line, and one item per
root in a module, so that nightly rustfmt has nothing to merge with either
setting. rustfmt's stable options (what `cargo fmt` and the series' check
run) already sort the items within a block.

The checks, on every run of `use` items:

- each blank-line-separated block holds one group, and the blocks' groups
  come in the order std, external, local, each at most once;
- no two mergeable items (same visibility, no attributes, no comment) share
  a crate root, in the run or anywhere else in the same module or block
  (stricter than rustfmt, which merges within the run: one item per root
  per module);
- within one item, no brace list holds two paths with the same first
  segment (`crate::{a::b, a::c}` is `crate::a::{b, c}` once merged), other
  than a bare name beside its own paths (`{a, a::b}`, which rustfmt keeps).

The source must be formatted by rustfmt (one item per line start), as the
crate's and the generated module's are.
"""

import re
import sys
from pathlib import Path

USE = re.compile(r"^(\s*)((?:pub(?:\([a-z:\s]+\))?\s+)?)use\s+(.*)$")
ATTR = re.compile(r"^\s*#\[")
COMMENT = re.compile(r"^\s*//")
GROUPS = ("std", "external", "local")


def group_of(root):
    if root in ("std", "core", "alloc"):
        return 0
    if root in ("crate", "self", "super"):
        return 2
    return 1


class Item:
    """One `use` item: its lines (attributes and comments above it included)."""

    def __init__(self, start, lines, indent, vis, tree, attrs, comment):
        self.start = start  # 1-based line of the `use`
        self.first = start - (len(lines) - 1)
        self.end = start  # of its first line, above it included
        self.lines = lines  # its text, attributes and comments above it included
        self.indent = indent
        self.vis = " ".join(vis.split())
        self.tree = tree  # the use tree's text, without `use` and `;`
        self.attrs = attrs
        self.comment = comment
        self.root = root_of(tree)
        self.group = group_of(self.root)

    @property
    def mergeable(self):
        return not self.attrs and not self.comment


def root_of(tree):
    m = re.match(r"\s*(?:::)?\s*(r#)?([A-Za-z_][A-Za-z0-9_]*)", tree)
    return m.group(2) if m else tree.strip()


# ---------------------------------------------------------------------------
# Use trees: parsed, flattened to paths, merged as `imports_granularity = "Crate"` does.

TOKEN = re.compile(r"\s*(::|\{|\}|,|\*|(?:r#)?[A-Za-z_][A-Za-z0-9_]*)")


def tokens(text):
    out, i = [], 0
    text = text.strip()
    while i < len(text):
        m = TOKEN.match(text, i)
        if not m:
            if text[i:].strip() == "":
                break
            raise ValueError(f"cannot read the use tree {text!r}")
        out.append(m.group(1))
        i = m.end()
    return out


def parse(text):
    """A use tree as nested lists: a tree is (segments, tail); tail is None (the
    last segment is a name, possibly `name as alias`), "*" or a list of trees."""
    toks = tokens(text)
    pos = 0

    def tree():
        nonlocal pos
        segs = []
        while True:
            t = toks[pos]
            if t == "{":
                pos += 1
                items = []
                while toks[pos] != "}":
                    items.append(tree())
                    if toks[pos] == ",":
                        pos += 1
                pos += 1
                return segs, items
            if t == "*":
                pos += 1
                return segs, "*"
            if t == "::":
                pos += 1
                continue
            name = t
            pos += 1
            if pos < len(toks) and toks[pos] == "as":
                name = f"{name} as {toks[pos + 1]}"
                pos += 2
            segs.append(name)
            if pos >= len(toks) or toks[pos] != "::":
                return segs, None

    result = tree()
    if pos != len(toks):
        raise ValueError(f"cannot read the use tree {text!r}")
    return result


def flatten(t, prefix=()):
    segs, tail = t
    path = prefix + tuple(segs)
    if tail is None:
        return [path]
    if tail == "*":
        return [path + ("*",)]
    out = []
    for sub in tail:
        out += flatten(sub, path)
    return out


def render(paths):
    """The merged tree of `paths` (which share their first segment)."""
    trie = {}
    for p in paths:
        node = trie
        for seg in p:
            node = node.setdefault(seg, {})
        node[None] = {}

    def show(seg, node):
        kids = [k for k in node if k is not None]
        terminal = None in node
        if not kids:
            return seg
        parts = (["self"] if terminal else []) + [show(k, node[k]) for k in sorted(kids)]
        if len(parts) == 1:
            return f"{seg}::{parts[0]}"
        return f"{seg}::{{{', '.join(parts)}}}"

    (root,) = [k for k in trie if k is not None]
    return show(root, trie[root])


def duplicate_heads(t):
    """Brace lists of the tree `t` that hold two paths with the same first segment."""
    segs, tail = t
    found = []
    if isinstance(tail, list):
        heads = {}
        for sub in tail:
            s, tl = sub
            if s and (len(s) > 1 or tl is not None):
                heads.setdefault(s[0], 0)
                heads[s[0]] += 1
        found += [h for h, n in heads.items() if n > 1]
        for sub in tail:
            found += duplicate_heads(sub)
    return found


# ---------------------------------------------------------------------------
# Reading a file's `use` items, in runs.


def runs(text):
    """The runs of `use` items of a formatted Rust file: lists of (Item or
    None for a blank line), with the scope (the line that opened the
    enclosing module or block) of each run."""
    lines = text.split("\n")
    result = []
    current = None
    pending = []  # attribute and comment lines above the next item
    openers = []  # (indent, line number) of the enclosing lines
    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        m = USE.match(line)
        if m and not COMMENT.match(line):
            start = i
            body = [line]
            while not body[-1].rstrip().endswith(";"):
                i += 1
                body.append(lines[i])
            indent = len(m.group(1))
            tree = " ".join([m.group(3)] + [b.strip() for b in body[1:]]).rstrip().removesuffix(";")
            tree = re.sub(r"//[^\n]*$", "", tree).strip().removesuffix(";")
            attrs = any(ATTR.match(p) for p in pending)
            comment = any(COMMENT.match(p) for p in pending) or "//" in "\n".join(body) or "/*" in "\n".join(body)
            while openers and openers[-1][0] >= indent:
                openers.pop()
            scope = openers[-1][1] if openers else -1
            item = Item(start + 1, pending + [line], indent, m.group(2), tree, attrs, comment)
            if current is None:
                current = {"scope": scope, "entries": []}
                result.append(current)
            item.lines = pending + body
            item.end = start + len(body)  # 1-based line of its `;`
            current["entries"].append(item)
            pending = []
            i += 1
            continue
        if not stripped:
            if pending:
                # Comments apart from the next item by a blank line: not its.
                current = None
                pending = []
            elif current is not None:
                current["entries"].append(None)
            i += 1
            continue
        if ATTR.match(line) or (COMMENT.match(line) and not stripped.startswith("//!")):
            pending.append(line)
            i += 1
            continue
        # Anything else ends the run.
        current = None
        pending = []
        indent = len(line) - len(line.lstrip())
        while openers and openers[-1][0] >= indent:
            openers.pop()
        openers.append((indent, i + 1))
        i += 1
    for r in result:
        while r["entries"] and r["entries"][-1] is None:
            r["entries"].pop()
    return result


def blocks(run):
    out, cur = [], []
    for e in run["entries"]:
        if e is None:
            if cur:
                out.append(cur)
            cur = []
        else:
            cur.append(e)
    if cur:
        out.append(cur)
    return out


def problems(text):
    """What nightly rustfmt with kube-rs's options (and the StdExternalCrate
    shape) would change in `text`: a list of (line, message)."""
    found = []
    per_scope = {}
    for run in runs(text):
        last = -1
        for block in blocks(run):
            groups = sorted({it.group for it in block})
            if len(groups) > 1:
                found.append((block[0].start, "one block mixes the "
                              + " and ".join(GROUPS[g] for g in groups) + " groups of imports"))
                continue
            g = groups[0]
            if g <= last:
                found.append((block[0].start, f"a block of {GROUPS[g]} imports after the {GROUPS[last]} ones"
                              if g < last else f"the {GROUPS[g]} imports are in two blocks"))
            last = max(last, g)
        for it in (e for e in run["entries"] if e is not None):
            try:
                dups = duplicate_heads(parse(it.tree))
            except (ValueError, IndexError) as e:
                found.append((it.start, str(e)))
                continue
            for h in dups:
                found.append((it.start, f"`{h}::` twice in one brace list of `use {it.tree}` (merge them)"))
            if not it.mergeable:
                continue
            key = (run["scope"], it.vis, it.root)
            if key in per_scope:
                found.append((it.start, f"`{it.vis + ' ' if it.vis else ''}use {it.root}::` again "
                              f"(line {per_scope[key]}): one item per crate root per module"))
            else:
                per_scope[key] = it.start
    return sorted(found)


def reshape(text):
    """`text` with each run of `use` items that `problems` would report made
    into the shape: mergeable items of one root and visibility merged into
    one, groups in the order std, external, local, one block each. rustfmt
    then sorts and wraps them."""
    bad = {line for line, _ in problems(text)}
    if not bad:
        return text
    lines = text.split("\n")
    replaced = {}
    for run in runs(text):
        entries = [e for e in run["entries"] if e is not None]
        if not any(entries[0].first <= b <= entries[-1].end for b in bad):
            continue
        begin = entries[0].first - 1
        end = entries[-1].end - 1
        merged = {}
        kept = []
        for it in entries:
            if it.mergeable:
                merged.setdefault((it.vis, it.root), []).append(it)
            else:
                kept.append((it.group, it.lines))
        for (vis, _root), items in merged.items():
            paths = [p for it in items for p in flatten(parse(it.tree))]
            text_ = " " * items[0].indent + (vis + " " if vis else "") + f"use {render(paths)};"
            kept.append((items[0].group, [text_]))
        out = []
        for g in range(3):
            block = [l for grp, ls in kept if grp == g for l in ls]
            if block:
                if out:
                    out.append("")
                out += block
        replaced[begin] = (end, out)
    result = []
    i = 0
    while i < len(lines):
        if i in replaced:
            end, out = replaced[i]
            result += out
            i = end + 1
        else:
            result.append(lines[i])
            i += 1
    return "\n".join(result)


def check_paths(paths, label=None):
    """Prints the problems of every .rs file under `paths`; returns how many."""
    n = 0
    files = 0
    for p in map(Path, paths):
        for f in sorted(p.rglob("*.rs")) if p.is_dir() else [p]:
            files += 1
            for line, msg in problems(f.read_text()):
                print(f"{label(f) if label else f}:{line}: {msg}")
                n += 1
    return n, files


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] != "check":
        sys.exit(__doc__)
    n, files = check_paths(sys.argv[2:])
    if n:
        sys.exit(f"upstream_imports: {n} import(s) not in the shape kube-rs's rustfmt.toml asks (see scripts/upstream_imports.py)")
    print(f"upstream_imports: the imports of {files} files are in kube-rs's shape (imports_granularity = \"Crate\", StdExternalCrate groups)")
