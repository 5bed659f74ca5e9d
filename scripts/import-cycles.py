#!/usr/bin/env python3
"""Finds import circles, and imports that run up the layers, between the files of a Rust crate.

Reads every `.rs` file under a crate's `src/`, resolves each path that starts with
`crate::`, `super::` or `self::` (in `use` statements and in code) to the file of the
deepest module it names, and reports the strongly connected components of that graph
with more than one file. A `mod x;` declaration is containment, not a use, so it adds no
edge, and a re-export (`pub use x::Y` in a `mod.rs` or `lib.rs`) is a facade: a path
through it counts as a use of the file that defines `Y`. Usage:

    scripts/import-cycles.py CRATE_DIR [CRATE_DIR ...]   # exit 1 if any circle or upward arrow

A crate may declare its layers in `CRATE_DIR/layers.toml`: for a module (`""` is the crate
root, `"cluster"` a folder), its child modules from the top layer down, one list per layer.
A file may use its own layer and those below; an import into a layer above is an upward
arrow and fails the check. Every child of a module with declared layers must be listed, so a
new module has to be placed. The deepest declared module that holds both ends decides.

Comments and string literals are stripped before reading paths.
"""
import os
import re
import sys
import tomllib

REEXPORT_RE = re.compile(r"\bpub\s+use\s+([^;]+);")
PATH_RE = re.compile(r"\b(crate|super|self)((?:::[A-Za-z_][A-Za-z0-9_]*)+)")
USE_GROUP_RE = re.compile(r"\buse\s+((?:crate|super|self)(?:::[A-Za-z_][A-Za-z0-9_]*)*)::\{")


def strip_comments_and_strings(text):
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if text.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif text.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
        elif c == "r" and re.match(r'r#*"', text[i:i + 10]) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'r(#*)"', text[i:])
            end = '"' + m.group(1)
            j = text.find(end, i + len(m.group(0)))
            i = n if j < 0 else j + len(end)
            out.append('""')
        elif c == '"':
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
            i += 1
            out.append('""')
        elif c == "'" and re.match(r"'(\\.|[^\\'])'", text[i:i + 4] + "    "):
            m = re.match(r"'(\\[^']*|[^\\'])'", text[i:])
            i += len(m.group(0)) if m else 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def module_of(src, path):
    """Module path (list of names) of a file: src/a/b.rs -> [a, b]; src/a/mod.rs -> [a]."""
    rel = os.path.relpath(path, src)[:-3].split(os.sep)
    if rel[0] in ("bin", "main"):
        return None  # a binary is a crate of its own that uses the library
    if rel[-1] in ("mod", "lib"):
        rel = rel[:-1]
    return rel


def build_graph(src):
    files = {}
    for root, _, names in os.walk(src):
        for name in names:
            if name.endswith(".rs"):
                path = os.path.join(root, name)
                mod = module_of(src, path)
                if mod is not None:
                    files[tuple(mod)] = path
    edges = {path: set() for path in files.values()}
    facades = {}  # (module..., name) re-exported there -> the path it names
    pending = []
    for mod, path in sorted(files.items(), key=lambda kv: -len(kv[0])):
        with open(path, encoding="utf-8") as f:
            text = strip_comments_and_strings(f.read())
        # `#[cfg(test)] mod tests { ... }` is compiled only for tests; it may use anything.
        text = re.split(r"#\[cfg\(test\)\]\s*mod\s+tests\b", text)[0]
        is_dir_module = os.path.basename(path) in ("mod.rs", "lib.rs")
        if is_dir_module:
            for m in REEXPORT_RE.finditer(text):
                for name, target in reexported_names(m.group(1)):
                    facades[tuple(mod) + (name,)] = list(mod) + target
            text = REEXPORT_RE.sub("", text)
        targets = []
        for m in PATH_RE.finditer(text):
            targets.append((m.group(1), m.group(2).split("::")[1:]))
        # A child module declared here is named without a prefix (`channels::handler`).
        is_dir = os.path.basename(path) in ("mod.rs", "lib.rs")
        for child in re.findall(r"\bmod\s+([A-Za-z_][A-Za-z0-9_]*)\s*;", text):
            for m in re.finditer(r"(?<![:\w])" + child + r"((?:::[A-Za-z_][A-Za-z0-9_]*)+)", text):
                rest = [child] + m.group(1).split("::")[1:]
                targets.append(("self" if is_dir else "selfmod", rest))
        # `use crate::a::{b, c::d}`: each item of the group extends the prefix.
        for m in USE_GROUP_RE.finditer(text):
            start = m.end()
            depth, j = 1, start
            while j < len(text) and depth:
                depth += {"{": 1, "}": -1}.get(text[j], 0)
                j += 1
            head = m.group(1).split("::")
            for item in re.findall(r"[A-Za-z_][A-Za-z0-9_]*(?:::[A-Za-z_][A-Za-z0-9_]*)*", text[start:j - 1]):
                targets.append((head[0], head[1:] + item.split("::")))
        for root, rest in targets:
            if root == "crate":
                base = []
            elif root == "super":
                base = list(mod[:-1])
                while rest and rest[0] == "super":
                    base, rest = base[:-1], rest[1:]
            else:  # self, or a child of a file module (`a.rs` with `mod b;` is a::b)
                base = list(mod)
            pending.append((path, base + rest))
    for path, full in pending:
        target = files.get(tuple(resolve(full, files, facades)))
        if target and target != path:
            edges[path].add(target)
    return edges


def resolve(full, files, facades):
    """The deepest module a path names, seen through re-exports."""
    for _ in range(16):  # re-exports of re-exports; a bound in case of a loop
        for cut in range(len(full), 0, -1):
            if tuple(full[:cut]) in facades:
                full = facades[tuple(full[:cut])] + full[cut:]
                break
        else:
            break
    while full and tuple(full) not in files:
        full = full[:-1]
    return full


def reexported_names(tree):
    """`a::{B, c::D as E}` -> [("B", [a, B]), ("E", [a, c, D])] (paths relative to here)."""
    out = []
    tree = tree.strip()
    if tree.startswith("self::"):
        tree = tree[len("self::"):]
    m = re.match(r"^((?:[A-Za-z_]\w*::)*)\{(.*)\}$", tree, re.S)
    if m:
        head = [p for p in m.group(1).split("::") if p]
        depth, item, items = 0, "", []
        for ch in m.group(2):
            if ch == "," and depth == 0:
                items.append(item)
                item = ""
                continue
            depth += {"{": 1, "}": -1}.get(ch, 0)
            item += ch
        items.append(item)
        for it in items:
            if it.strip() and it.strip() != "self":
                out += [(n, head + t) for n, t in reexported_names(it)]
        return out
    m = re.match(r"^([A-Za-z_]\w*(?:::[A-Za-z_]\w*)*)(?:\s+as\s+([A-Za-z_]\w*))?$", tree)
    if m:
        parts = m.group(1).split("::")
        if parts[0] in ("crate", "super"):
            return []  # a re-export from elsewhere; rare, resolved as a plain use
        out.append((m.group(2) or parts[-1], parts))
    return out


def cycles(edges):
    """Tarjan's strongly connected components with more than one node."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
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
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def load_layers(crate):
    """{module tuple: {child name: layer index (0 = top)}} from CRATE_DIR/layers.toml."""
    path = os.path.join(crate, "layers.toml")
    if not os.path.exists(path):
        return {}
    with open(path, "rb") as f:
        declared = tomllib.load(f).get("layers", {})
    out = {}
    for module, layers in declared.items():
        key = tuple(p for p in module.split("::") if p)
        out[key] = {name: i for i, layer in enumerate(layers) for name in layer}
    return out


def children(src, module):
    """The child modules of a module folder (files and folders, not mod.rs/lib.rs/main.rs)."""
    folder = os.path.join(src, *module)
    names = set()
    for entry in os.listdir(folder):
        full = os.path.join(folder, entry)
        if os.path.isdir(full) and (os.path.exists(os.path.join(full, "mod.rs")) or os.path.exists(full + ".rs")):
            names.add(entry)
        elif entry.endswith(".rs") and entry not in ("mod.rs", "lib.rs", "main.rs"):
            names.add(entry[:-3])
    if not module:
        names.discard("bin")
    return names


def layer_problems(src, edges, layers):
    """Unplaced modules and upward arrows: (message, ...) lines."""
    out = []
    for module, placed in sorted(layers.items()):
        if not os.path.isdir(os.path.join(src, *module)):
            out.append(f"layers.toml names {'::'.join(module) or 'the crate root'}, which is not a folder")
            continue
        for name in sorted(children(src, module) - set(placed)):
            out.append(f"module {'::'.join(module + (name,))} has no layer in layers.toml")
        for name in sorted(set(placed) - children(src, module)):
            out.append(f"layers.toml places {'::'.join(module + (name,))}, which does not exist")
    for a in sorted(edges):
        ma = module_of(src, a)
        for b in sorted(edges[a]):
            mb = module_of(src, b)
            common = 0
            while common < min(len(ma), len(mb)) and ma[common] == mb[common]:
                common += 1
            for depth in range(common, -1, -1):
                placed = layers.get(tuple(ma[:depth]))
                if placed is None or depth >= len(ma) or depth >= len(mb):
                    continue
                la, lb = placed.get(ma[depth]), placed.get(mb[depth])
                if la is not None and lb is not None and lb < la:
                    out.append(f"upward arrow: {a} ({ma[depth]}) uses {b} ({mb[depth]}, a layer above)")
                break
    return out


def main(crates):
    found = 0
    for crate in crates:
        src = os.path.join(crate, "src")
        edges = build_graph(src)
        for line in layer_problems(src, edges, load_layers(crate)):
            found += 1
            print(line)
        for comp in cycles(edges):
            found += 1
            print(f"import circle in {crate} ({len(comp)} files):")
            members = set(comp)
            for v in comp:
                inside = sorted(w for w in edges[v] if w in members)
                print(f"  {v} -> {', '.join(inside)}")
    if found:
        print(f"{found} import circle(s) or layer violation(s)")
        return 1
    print(f"no import circles and no upward arrows in {', '.join(crates)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or ["daemon", "raft-store", "cuda-shim"]))
