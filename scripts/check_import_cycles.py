#!/usr/bin/env python3
"""Fails when the files of one crate import each other in a circle.

A file depends on another when its code names an item defined there: through `use crate::…`,
`use super::…`, `use self::…` or an inline `crate::…`/`super::…` path. Re-exports (`pub use`,
`pub(crate) use`, `pub(super) use`) are followed to the file that defines the item and are not
edges themselves: a module that re-exports its children's items does not depend on them.
`#[cfg(test)]` modules are left out (a test may reach anywhere in its crate).

Usage: python3 scripts/check_import_cycles.py [CRATE_DIR ...]   (default: every workspace member)
Exit 0 with no circle, 1 with the circles listed, one line each.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def strip_comments_and_strings(src: str) -> str:
    """Blanks comments, string and char literals, keeping line structure."""
    out = []
    i, n = 0, len(src)
    while i < n:
        c = src[i]
        if src.startswith("//", i):
            j = src.find("\n", i)
            i = n if j < 0 else j
        elif src.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if src.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif src.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    if src[i] == "\n":
                        out.append("\n")
                    i += 1
        elif c == "r" and re.match(r'r#*"', src[i:i + 20]) and (i == 0 or not (src[i - 1].isalnum() or src[i - 1] == "_")):
            m = re.match(r'r(#*)"', src[i:])
            close = '"' + m.group(1)
            j = src.find(close, i + len(m.group(0)))
            j = n if j < 0 else j + len(close)
            out.append('""' + "\n" * src.count("\n", i, j))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and src[j] != '"':
                j += 2 if src[j] == "\\" else 1
            out.append('""' + "\n" * src.count("\n", i, j))
            i = j + 1
        elif c == "'":
            # A char literal ('a', '\n', '\u{1F600}'), not a lifetime ('a).
            m = re.match(r"'(\\u\{[0-9a-fA-F]+\}|\\.|[^\\'])'", src[i:])
            if m:
                out.append("' '")
                i += len(m.group(0))
            else:
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def drop_test_modules(src: str) -> str:
    """Removes `#[cfg(test)] mod name { … }` blocks (brace-matched)."""
    while True:
        m = re.search(r"#\[cfg\(test\)\]\s*(pub(\([^)]*\))?\s+)?mod\s+\w+\s*\{", src)
        if not m:
            return src
        depth, i = 1, m.end()
        while i < len(src) and depth:
            depth += {"{": 1, "}": -1}.get(src[i], 0)
            i += 1
        src = src[: m.start()] + "\n" * src.count("\n", m.start(), i) + src[i:]


def expand_use_tree(tree: str) -> list[str]:
    """`a::{b, c::{d, e as f}, g::*}` → ['a::b', 'a::c::d', 'a::c::e', 'a::g::*']."""
    tree = re.sub(r"\s+", "", tree)
    out: list[str] = []

    def walk(prefix: str, t: str) -> None:
        if "{" not in t:
            t = re.sub(r"as\w+$", "", t) if re.search(r"[^:]as\w+$", t) else t
            out.append(prefix + t)
            return
        head, _, rest = t.partition("{")
        body = rest[: rest.rfind("}")]
        parts, depth, cur = [], 0, ""
        for ch in body:
            if ch == "," and depth == 0:
                parts.append(cur)
                cur = ""
                continue
            depth += {"{": 1, "}": -1}.get(ch, 0)
            cur += ch
        parts.append(cur)
        for p in parts:
            if p:
                walk(prefix + head, p)

    walk("", tree)
    return [re.sub(r"::self$", "", p) for p in out]


USE_RE = re.compile(r"(?<![\w:])(pub(?:\([^)]*\))?\s+)?use\s+([^;]+);")
PATH_RE = re.compile(r"(?<![\w:])((?:crate|super|self)(?:::\w+)+)")


class Crate:
    def __init__(self, src_dir: Path, root_file: Path):
        self.src_dir = src_dir
        self.modules: dict[tuple[str, ...], Path] = {}
        self.reexports: dict[tuple[str, ...], dict[str, tuple[str, ...]]] = {}
        self.uses: dict[Path, list[tuple[str, ...]]] = {}
        self.text: dict[Path, str] = {}
        self._collect((), root_file)

    def _collect(self, mod_path: tuple[str, ...], file: Path) -> None:
        self.modules[mod_path] = file
        text = drop_test_modules(strip_comments_and_strings(file.read_text()))
        self.text[file] = text
        # Child module files: `mod x;` (not inline `mod x { … }`).
        is_dir_owner = file.name in ("lib.rs", "main.rs", "mod.rs")
        base = file.parent if is_dir_owner else file.parent / file.stem
        for m in re.finditer(r"(?<![\w:])mod\s+(\w+)\s*;", text):
            name = m.group(1)
            attr = re.search(r'#\[path\s*=\s*""\]\s*$', text[: m.start()].rstrip())
            for cand in (base / f"{name}.rs", base / name / "mod.rs"):
                if cand.exists() and not attr:
                    self._collect(mod_path + (name,), cand)
                    break

    def absolute(self, mod_path: tuple[str, ...], path: str) -> tuple[str, ...] | None:
        segs = path.split("::")
        if segs[0] == "crate":
            cur: list[str] = []
            segs = segs[1:]
        elif segs[0] in ("super", "self"):
            cur = list(mod_path)
            while segs and segs[0] in ("super", "self"):
                if segs[0] == "super":
                    if not cur:
                        return None
                    cur.pop()
                segs = segs[1:]
        else:
            return None
        return tuple(cur + segs)

    def parse(self) -> None:
        for mod_path, file in self.modules.items():
            text = self.text[file]
            rex: dict[str, tuple[str, ...]] = {}
            used: list[tuple[str, ...]] = []
            spans = []
            for m in USE_RE.finditer(text):
                spans.append((m.start(), m.end()))
                for p in expand_use_tree(m.group(2)):
                    absolute = self.absolute(mod_path, p)
                    if absolute is None:
                        # A child module named directly (`use child::X`), or an external crate.
                        first = p.split("::")[0]
                        if mod_path + (first,) in self.modules:
                            absolute = mod_path + tuple(p.split("::"))
                        else:
                            continue
                    if m.group(1):
                        rex[absolute[-1]] = absolute
                    else:
                        used.append(absolute)
            rest = list(text)
            for a, b in spans:
                rest[a:b] = " " * (b - a)
            for m in PATH_RE.finditer("".join(rest)):
                absolute = self.absolute(mod_path, m.group(1))
                if absolute is not None:
                    used.append(absolute)
            self.reexports[mod_path] = rex
            self.uses[file] = used

    def defining_file(self, path: tuple[str, ...], depth: int = 0) -> Path | None:
        """The file that defines the item at `path`, following re-exports."""
        if depth > 16:
            return None
        if path in self.modules:
            return self.modules[path]
        for k in range(len(path) - 1, -1, -1):
            mod = path[:k]
            if mod in self.modules:
                rest = path[k:]
                if rest[0] == "*":
                    return self.modules[mod]
                target = self.reexports.get(mod, {}).get(rest[0])
                if target is not None and target != path:
                    return self.defining_file(target + rest[1:], depth + 1)
                # A glob re-export (`pub use child::*`): the item may live in that child.
                for name, t in self.reexports.get(mod, {}).items():
                    if name == "*" and t[:-1] + (rest[0],) != path:
                        f = self.defining_file(t[:-1] + rest, depth + 1)
                        if f is not None and f != self.modules.get(t[:-1]):
                            return f
                return self.modules[mod]
        return None

    def edges(self) -> dict[Path, set[Path]]:
        g: dict[Path, set[Path]] = {f: set() for f in self.uses}
        for f, used in self.uses.items():
            for p in used:
                t = self.defining_file(p)
                if t is not None and t != f:
                    g[f].add(t)
        return g


def cycles(g: dict[Path, set[Path]]) -> list[list[Path]]:
    """Strongly connected components with more than one file (Tarjan)."""
    index: dict[Path, int] = {}
    low: dict[Path, int] = {}
    stack: list[Path] = []
    on: set[Path] = set()
    out: list[list[Path]] = []
    counter = [0]

    def visit(v: Path) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(g.get(v, ())):
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

    sys.setrecursionlimit(10000)
    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def crate_roots(crate_dir: Path) -> list[Path]:
    src = crate_dir / "src"
    roots = [p for p in (src / "lib.rs", src / "main.rs") if p.exists()]
    roots += sorted((src / "bin").glob("*.rs")) if (src / "bin").is_dir() else []
    return roots


def main() -> int:
    if len(sys.argv) > 1:
        dirs = [Path(a).resolve() for a in sys.argv[1:]]
    else:
        members = tomllib.loads((ROOT / "Cargo.toml").read_text())["workspace"]["members"]
        dirs = [ROOT / m for m in members]
    found = 0
    for d in dirs:
        for root in crate_roots(d):
            crate = Crate(root.parent, root)
            crate.parse()
            for comp in cycles(crate.edges()):
                found += 1
                names = " <-> ".join(str(p.relative_to(ROOT)) for p in comp)
                print(f"import circle: {names}")
    sys.stdout.flush()
    if found:
        print(f"{found} import circle(s) between files; move the shared item to a file both import",
              file=sys.stderr)
        return 1
    print("no import circle between the files of any crate")
    return 0


if __name__ == "__main__":
    sys.exit(main())
