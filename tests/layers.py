#!/usr/bin/env python3
"""Layer check of `src/` (issue 35) and of the CSI crate's `csi/src/` (issue 49): no module
imports a higher one, no two files import each other.

Modules are the top-level ones of the crate, in layers (lowest first, one layer a line in
LAYERS); a module may use its own layer's and lower layers' modules, never a higher layer's.
A file "imports" another when it names it in a `use` or a path (`crate::a::b`, `super::x`,
`self::x`); a pair of files that name each other is a cycle, except a module's `mod.rs` with
its own direct child (the parent declares the child and the child uses the parent's types,
the way Rust lays a module out). Prints every violation; exits 1 if there is any.

Usage: tests/layers.py [SRC_DIR]   (default: src/ beside this script; csi/src uses CSI_LAYERS)
"""
import os
import re
import sys

# Lowest first. Modules on one line are peers (may use each other, but no two files may
# import each other).
LAYERS = [
    ["heap_trim", "http_server", "stats"],
    ["store"],
    ["namespace", "cache"],
    ["fetch"],
    ["reader", "prefetch"],
    ["fs", "metrics"],
    ["control"],
    ["cli"],
]
# The CSI crate, lowest first, by job (csi/src/lib.rs). Folders on one line are peers.
CSI_LAYERS = [
    ["log_forward"],
    # what a volume asks for
    ["kube"],
    # the mounter interface and `riffle mount`; what the plugin keeps on the node
    ["mounter", "node_state"],
    # volume bookkeeping
    ["volumes"],
    # the gRPC services
    ["grpc"],
    # the mounter's socket protocol
    ["remote"],
    # the binaries' start-up
    ["startup", "mounter_main"],
]

SRC = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "src")
SRC = os.path.normpath(SRC)
if SRC.endswith(os.path.join("csi", "src")):
    LAYERS = CSI_LAYERS
LAYER = {m: i for i, mods in enumerate(LAYERS) for m in mods}


def module_path(rel):
    """`fetch/claim.rs` -> ["fetch", "claim"]; `fetch/mod.rs` -> ["fetch"]; lib.rs -> []."""
    parts = rel[:-3].split("/")
    if parts[-1] in ("mod", "lib", "main"):
        parts = parts[:-1]
    return parts


files = {}
for root, _, names in os.walk(SRC):
    for n in names:
        if n.endswith(".rs"):
            rel = os.path.relpath(os.path.join(root, n), SRC)
            files[tuple(module_path(rel))] = rel


def strip(text):
    """The code without comments, strings and `#[cfg(test)]` modules."""
    text = re.sub(r"//[^\n]*", "", text)
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    text = re.sub(r'r#*"(?:.|\n)*?"#*|"(?:\\.|[^"\\])*"', '""', text)
    # Inline test modules: a test may reach anywhere.
    out, i = [], 0
    for m in re.finditer(r"#\[cfg\(test\)\]\s*mod\s+\w+\s*\{", text):
        if m.start() < i:
            continue
        out.append(text[i : m.start()])
        depth, j = 1, m.end()
        while j < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
        i = j
    out.append(text[i:])
    return "".join(out)


def is_test_file(rel, text):
    return rel.endswith("tests.rs") or rel == "test_support.rs" or rel.endswith("/test_support.rs")


def resolve(me, path):
    """The file (module path tuple) a path like `super::x::Y` from module `me` lands in."""
    segs = path.split("::")
    if segs[0] == "crate":
        base, segs = [], segs[1:]
    elif segs[0] in ("super", "self"):
        base = list(me)
        while segs and segs[0] in ("super", "self"):
            if segs[0] == "super":
                base = base[:-1]
            segs = segs[1:]
    else:
        return None
    cur = tuple(base)
    for s in segs:
        nxt = cur + (s,)
        if nxt in files:
            cur = nxt
        else:
            break
    return cur


# Test-only files (named tests.rs, or only declared under #[cfg(test)]).
test_only = set()
for mp, rel in files.items():
    if rel.endswith("tests.rs"):
        test_only.add(mp)
for mp, rel in files.items():
    text = open(os.path.join(SRC, rel)).read()
    for m in re.finditer(r"#\[cfg\(test\)\]\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;", text):
        test_only.add(mp + (m.group(1),))

edges = {}
for mp, rel in files.items():
    if mp in test_only or any(mp[:k] in test_only for k in range(1, len(mp))):
        continue
    text = strip(open(os.path.join(SRC, rel)).read())
    targets = set()
    # use trees: expand `a::{b, c::d}` one level deep enough for module resolution.
    for m in re.finditer(r"\b(?:crate|super|self)(?:::\w+)+(?:::\{[^;]*?\})?", text):
        s = m.group(0)
        head, _, tree = s.partition("::{")
        paths = [head]
        if tree:
            for item in re.split(r",", tree.rstrip("}")):
                item = item.strip().split(" as ")[0].strip("{} ")
                if item and item != "self" and item != "*":
                    paths.append(head + "::" + item.split("::{")[0])
        for p in paths:
            t = resolve(mp, p)
            if t is not None and t != mp and t != ():
                targets.add(t)
    edges[mp] = targets

bad = []
for a, ts in sorted(edges.items()):
    if not a:
        continue
    for b in sorted(ts):
        if not b or b in test_only:
            continue
        la, lb = LAYER.get(a[0]), LAYER.get(b[0])
        if la is None or lb is None:
            bad.append(f"unknown module: {'/'.join(a)} -> {'/'.join(b)} (add it to LAYERS)")
        elif lb > la:
            bad.append(f"upward: {files[a]} imports {files[b]} ({b[0]} is above {a[0]})")
        if a < b and a in edges.get(b, ()):
            parent_child = (len(a) + 1 == len(b) and b[: len(a)] == a) or (
                len(b) + 1 == len(a) and a[: len(b)] == b
            )
            if not parent_child:
                bad.append(f"cycle: {files[a]} <-> {files[b]}")

for line in bad:
    print(line)
n_edges = sum(len(t) for t in edges.values())
print(f"{len(files)} files, {n_edges} imports between files: {len(bad)} violation(s)")
sys.exit(1 if bad else 0)
