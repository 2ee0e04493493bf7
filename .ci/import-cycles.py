#!/usr/bin/env python3
"""Report import cycles between the top-level modules of each crate.

For every crates/<name>/src, each top-level module (foo.rs, foo/mod.rs and the
files under foo/) is a node; an edge A -> B is any `use crate::B`,
`crate::B::` path, `use crate::{B, ...}` group or `super::B` that resolves to
top-level module B, written in a file of module A. Strongly connected
components with more than one module are cycles. Binaries (src/main.rs,
src/bin/**) are separate crates and are skipped; lib.rs is the root, not a node.
Comments (so doc links) and string literals are not read.

By default test code counts too (`#[cfg(test)]` items and the files of
`#[cfg(test)] mod x;`); `--no-tests` leaves it out, to see the library's own graph.

Usage: python3 .ci/import-cycles.py [--no-tests] [repo root]   (exit 1 if any cycle)
"""
import re
import sys
from pathlib import Path

ARGS = [a for a in sys.argv[1:] if not a.startswith("--")]
NO_TESTS = "--no-tests" in sys.argv[1:]
ROOT = Path(ARGS[0] if ARGS else Path(__file__).resolve().parent.parent)

# One pass, so that `//` inside a string and `"` inside a comment are read right.
LEXEME = re.compile(
    r'//[^\n]*|/\*.*?\*/|r(#*)".*?"\1|b?"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])\'',
    re.S,
)
CFG_TEST = re.compile(r"#\[cfg\(test\)\]")
TEST_MOD_DECL = re.compile(r"\s*(?:#\[[^\]]*\]\s*)*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;")
CRATE_PATH = re.compile(r"\bcrate::(\{[^}]*\}|[A-Za-z_][A-Za-z0-9_]*)")
SUPER_PATH = re.compile(r"\b((?:super::)+)(\{[^}]*\}|[A-Za-z_][A-Za-z0-9_]*)")


def module_of(src: Path, f: Path):
    rel = f.relative_to(src).parts
    if rel[0] in ("main.rs", "lib.rs", "bin"):
        return None, rel
    return rel[0].removesuffix(".rs"), rel


def clean(text: str):
    """Source without comments and with every string and char literal emptied."""
    return LEXEME.sub(lambda m: "" if m.group(0).startswith("/") else '""', text)


def strip_tests(text: str):
    """(`text` without its `#[cfg(test)]` items, names of its `#[cfg(test)] mod x;`)."""
    out, test_mods, pos = [], [], 0
    for m in CFG_TEST.finditer(text):
        if m.start() < pos:
            continue
        out.append(text[pos : m.start()])
        decl = TEST_MOD_DECL.match(text, m.end())
        if decl:
            test_mods.append(decl.group(1))
            pos = decl.end()
            continue
        i, depth = m.end(), 0
        while i < len(text):
            c = text[i]
            if c == ";" and depth == 0:
                i += 1
                break
            if c == "{":
                depth += 1
            elif c == "}":
                depth -= 1
                if depth == 0:
                    i += 1
                    break
            i += 1
        pos = i
    out.append(text[pos:])
    return "".join(out), test_mods


def names(group: str):
    if group.startswith("{"):
        for item in group[1:-1].split(","):
            head = item.strip().split("::")[0].split(" ")[0].strip()
            if head and head not in ("self",):
                yield head
    else:
        yield group


def sccs(nodes, edges):
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out


def crate_cycles(src: Path):
    files = sorted(src.rglob("*.rs"))
    texts, test_only = {}, set()
    for f in files:
        texts[f] = clean(f.read_text())
        if NO_TESTS:
            texts[f], test_mods = strip_tests(texts[f])
            here = f.parent if f.name in ("lib.rs", "main.rs", "mod.rs") else f.with_suffix("")
            for t in test_mods:
                test_only |= {here / f"{t}.rs", here / t}
    if NO_TESTS:
        files = [f for f in files if not any(f == t or t in f.parents for t in test_only)]
    modules = {m for f in files if (m := module_of(src, f)[0])}
    edges, why = {}, {}
    for f in files:
        mod, rel = module_of(src, f)
        if mod is None:
            continue
        text = texts[f]
        # depth of the file's own module: foo.rs / foo/mod.rs -> 1, foo/bar.rs -> 2
        depth = len(rel) - (1 if rel[-1] == "mod.rs" else 0)
        targets = []
        for g in CRATE_PATH.findall(text):
            targets += names(g)
        for sup, g in SUPER_PATH.findall(text):
            ups = sup.count("super::")
            if depth - ups == 0:  # resolves to the crate root
                targets += names(g)
        for t in targets:
            if t in modules and t != mod:
                edges.setdefault(mod, set()).add(t)
                why.setdefault((mod, t), str(f.relative_to(ROOT)))
    return [c for c in sccs(modules, edges) if len(c) > 1], edges, why


def main():
    total = 0
    for src in sorted(ROOT.glob("crates/*/src")):
        cycles, edges, why = crate_cycles(src)
        crate = src.parent.name
        for c in cycles:
            total += 1
            print(f"{crate}: cycle of {len(c)}: {' <-> '.join(c)}")
            for a in c:
                for b in sorted(edges.get(a, ())):
                    if b in c:
                        print(f"    {a} -> {b}  ({why[(a, b)]})")
    print(f"{total} import cycle(s)")
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())
