"""The shape of the package, measured: modules at the top level of matpo_jax/, import cycles
(imports inside functions count), library modules that import run-level ones (run/ and the
entry points), the longest functions, and lines of library code.

    python benchmarks/code_shape.py                 # this checkout
    python benchmarks/code_shape.py --root=/tmp/old  # another checkout (e.g. a worktree of an old commit)
"""
from __future__ import annotations

import argparse
import ast
import os
from collections import defaultdict

PACKAGE = "matpo_jax"


def modules(root: str) -> dict[str, str]:
    """Dotted module name -> file path, for every .py file of the package."""
    found = {}
    for dirpath, _, files in os.walk(os.path.join(root, PACKAGE)):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(dirpath, name)
                dotted = os.path.relpath(path, root)[:-3].replace(os.sep, ".")
                found[dotted.removesuffix(".__init__")] = path
    return found


def imported(tree: ast.AST, module: str, known: set[str], is_package: bool) -> set[str]:
    """Package modules `module` imports anywhere in its file (top level or inside functions)."""
    out = set()
    base = module.split(".") if is_package else module.split(".")[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            parent = node.module or ""
            if node.level:
                parent = ".".join(base[:len(base) - node.level + 1] + ([parent] if parent else []))
            # `from pkg import submodule` imports the submodule; `from pkg import name`, pkg.
            names = [f"{parent}.{a.name}" if f"{parent}.{a.name}" in known else parent
                     for a in node.names]
        else:
            continue
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != module:
                out.add(name)
    return out


def is_run_level(module: str, mods: dict[str, str]) -> bool:
    """run/ and the entry points (top-level modules that are not packages)."""
    parts = module.split(".")
    entry_point = len(parts) == 2 and not mods[module].endswith("__init__.py")
    return entry_point or (len(parts) > 2 and parts[1] == "run")


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def measure(root: str, longest: int = 10) -> dict:
    mods = modules(root)
    graph, functions, library_lines = defaultdict(set), [], 0
    for module, path in mods.items():
        with open(path, encoding="utf-8") as f:
            source = f.read()
        tree = ast.parse(source)
        graph[module] |= imported(tree, module, set(mods), path.endswith("__init__.py"))
        if not is_run_level(module, mods):
            library_lines += len(source.splitlines())
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                functions.append((node.end_lineno - node.lineno + 1,
                                  f"{os.path.relpath(path, root)}:{node.lineno} {node.name}"))
    top_level = sorted(m for m in mods if m.count(".") == 1 and not mods[m].endswith("__init__.py"))
    upward = sorted(f"{m} -> {d}" for m in mods if not is_run_level(m, mods) and m != PACKAGE
                    for d in graph[m] if is_run_level(d, mods))
    return {"top_level_modules": top_level, "import_cycles": cycles(graph),
            "library_imports_of_run_level": upward,
            "longest_functions": sorted(functions, reverse=True)[:longest],
            "library_lines": library_lines,
            "all_lines": sum(len(open(p, encoding="utf-8").read().splitlines())
                             for p in mods.values())}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    args = parser.parse_args()
    shape = measure(args.root)
    print(f"top-level modules ({len(shape['top_level_modules'])}): "
          f"{', '.join(m.split('.')[1] for m in shape['top_level_modules'])}")
    print(f"import cycles: {len(shape['import_cycles'])}")
    for cycle in shape["import_cycles"]:
        print("   ", " <-> ".join(cycle))
    print(f"library modules importing run-level ones: {len(shape['library_imports_of_run_level'])}")
    for edge in shape["library_imports_of_run_level"]:
        print("   ", edge)
    print(f"lines: {shape['library_lines']} library, {shape['all_lines']} in the package")
    print("longest functions:")
    for lines, where in shape["longest_functions"]:
        print(f"    {lines:4d}  {where}")


if __name__ == "__main__":
    main()
