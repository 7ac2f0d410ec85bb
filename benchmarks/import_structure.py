"""Print the import structure of ``src/opengem``: lines per folder, import cycles between modules, imports
that point up the layers, function-local imports, and the longest functions.

    .venv/bin/python benchmarks/import_structure.py [--src src/opengem]

The layers, bottom to top (DESIGN.md §3; an import may only point down or sideways):
errors/config -> ops -> data -> model -> metrics -> train -> transfer -> bench/serve -> cli/demo.
"""

from __future__ import annotations

import argparse
import ast
from collections import defaultdict
from pathlib import Path

LAYERS = {"errors": 0, "config": 2, "ops": 1, "data": 2, "model": 3, "metrics": 3, "train": 4,
          "transfer": 5, "bench": 6, "serve": 6, "cli": 7, "demo": 7, "__init__": 0}


def module_name(path: Path, root: Path) -> str:
    rel = path.relative_to(root.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def layer_of(mod: str) -> int:
    parts = mod.split(".")
    return LAYERS.get(parts[1] if len(parts) > 1 else "__init__", 0)


def scan(root: Path) -> dict:
    modules = {module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    edges: dict[str, set[str]] = defaultdict(set)  # module-level imports only (cycles at import time)
    all_edges: dict[str, set[str]] = defaultdict(set)
    local_imports = 0
    functions: list[tuple[int, str]] = []
    folder_lines: dict[str, int] = defaultdict(int)
    for mod, path in modules.items():
        text = path.read_text()
        folder = str(path.parent.relative_to(root.parent))
        folder_lines[folder] += text.count("\n")
        tree = ast.parse(text)
        parents: dict[ast.AST, ast.AST] = {}
        for node in ast.walk(tree):
            for child in ast.iter_child_nodes(node):
                parents[child] = node
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                functions.append((node.end_lineno - node.lineno + 1, f"{mod}.{node.name}"))
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = mod.split(".")[: -node.level] if path.name != "__init__.py" else mod.split(".")
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                names = [f"{target}.{a.name}" for a in node.names]
            else:
                names = [a.name for a in node.names]
            targets = set()
            for n in names:
                while n and n not in modules:
                    n = n.rsplit(".", 1)[0] if "." in n else ""
                if n and n != mod:
                    targets.add(n)
            if not targets:
                continue
            p, in_function, type_only = parents.get(node), False, False
            while p is not None:
                if isinstance(p, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    in_function = True
                if isinstance(p, ast.If) and "TYPE_CHECKING" in ast.unparse(p.test):
                    type_only = True
                p = parents.get(p)
            if not type_only:  # an import only for type checkers never runs
                all_edges[mod] |= targets
            if in_function:
                local_imports += 1
            elif not type_only:
                edges[mod] |= targets
    return {"modules": modules, "edges": edges, "all_edges": all_edges, "local_imports": local_imports,
            "functions": sorted(functions, reverse=True), "folder_lines": dict(folder_lines)}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
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

    for v in sorted(set(edges) | {w for ws in edges.values() for w in ws}):
        if v not in index:
            visit(v)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--src", default="src/opengem")
    ap.add_argument("--top", type=int, default=10)
    args = ap.parse_args()
    root = Path(args.src).resolve()
    s = scan(root)
    print("lines per folder")
    for folder, n in sorted(s["folder_lines"].items()):
        print(f"  {folder:32s} {n:6d}")
    print(f"  {'total':32s} {sum(s['folder_lines'].values()):6d}")
    found = cycles(s["all_edges"])
    print(f"import cycles (any import, function-local included): {len(found)}")
    for c in found:
        print("  " + " <-> ".join(c))
    up = sorted((a, b) for a, bs in s["all_edges"].items() for b in bs if layer_of(b) > layer_of(a))
    print(f"imports pointing up the layers: {len(up)}")
    for a, b in up:
        print(f"  {a} -> {b}")
    print(f"function-local imports: {s['local_imports']}")
    print(f"the {args.top} longest functions (lines)")
    for n, name in s["functions"][: args.top]:
        print(f"  {n:4d}  {name}")


if __name__ == "__main__":
    main()
