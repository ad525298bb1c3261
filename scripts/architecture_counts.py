#!/usr/bin/env python3
"""Counts that say how far profkit is from "one engine", read from the source (ast).

    python scripts/architecture_counts.py [--root CHECKOUT] [--json]

- run-creation sites: calls that make a run folder, outside :mod:`profkit.rundir`:
  ``open_run`` (the one lifecycle: it writes the final status) and every other way
  (``new_run``, ``new_run_dir``, a ``RunDir(...)`` written with ``.save()``,
  ``.update()``, ``.finish()`` or ``.add_artifact()``; a stand-in ``RunDir`` that only
  names a folder and is never written is not a run);
- runner classes: classes outside ``experiments/harness.py`` that run statements
  themselves (``timed_execute``, a ``Cluster(...)`` start or an ``interleave`` loop);
- cluster starts outside the engine: ``Cluster(...)`` constructions in experiments/,
  cli/ and lab/ other than harness.py (and the cluster command, whose job it is);
- imports of profkit modules inside functions, per package (the import-rule test's
  count);
- the largest modules (lines).

No number here is measured: each is a count of the source tree given.
"""
from __future__ import annotations

import argparse
import ast
import json
from pathlib import Path

RUN_OPEN = {"open_run"}
RUN_OTHER = {"new_run", "new_run_dir", "_new_run"}
RUNNER_CALLS = {"timed_execute", "Cluster", "interleave"}


def _call_name(node: ast.Call) -> str:
    f = node.func
    if isinstance(f, ast.Name):
        return f.id
    if isinstance(f, ast.Attribute):
        return f.attr
    return ""


#: what makes a ``RunDir(...)`` a run on disk (a stand-in that names a folder in a graph
#: and is never written is not a run)
_WRITES = {"save", "update", "finish", "add_artifact"}


def _written_rundirs(tree: ast.AST) -> set[int]:
    """ids of the ``RunDir(...)`` calls in *tree* whose object is written: called on
    directly (``RunDir(...).save()``) or through the name it is assigned to, in the same
    function (or module body)."""
    out: set[int] = set()
    parents: dict[int, ast.AST] = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            parents[id(child)] = node
    scopes = [tree, *(n for n in ast.walk(tree)
                      if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef))]
    for call in ast.walk(tree):
        if not (isinstance(call, ast.Call) and _call_name(call) == "RunDir"):
            continue
        up = parents.get(id(call))
        if isinstance(up, ast.Attribute) and up.attr in _WRITES:
            out.add(id(call))
            continue
        names = {t.id for t in getattr(up, "targets", [getattr(up, "target", None)])
                 if isinstance(t, ast.Name)} if isinstance(
                     up, ast.Assign | ast.AnnAssign) else set()
        if not names:
            out.add(id(call))  # passed on or returned: count it (it may be written)
            continue
        scope = tree
        node: ast.AST | None = call
        while node is not None:
            node = parents.get(id(node))
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                scope = node
                break
        assert scope in scopes
        if any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
               and n.func.attr in _WRITES and isinstance(n.func.value, ast.Name)
               and n.func.value.id in names for n in ast.walk(scope)):
            out.add(id(call))
    return out


def _files(pkg: Path) -> list[Path]:
    return sorted(p for p in pkg.rglob("*.py") if "__pycache__" not in p.parts)


def function_imports(pkg: Path) -> dict[str, int]:
    """Imports of profkit modules inside function bodies, per package of *pkg* (the
    profkit folder; a module at its top counts as ``(top)``), each counted once. The
    import-rule test holds these counts under its ceilings."""
    out: dict[str, int] = {}
    for p in _files(pkg):
        rel = p.relative_to(pkg).parts
        top = rel[0] if len(rel) > 1 else "(top)"
        seen: set[int] = set()
        for fn in ast.walk(ast.parse(p.read_text(), str(p))):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for n in ast.walk(fn):
                if id(n) in seen:
                    continue
                seen.add(id(n))
                if (isinstance(n, ast.ImportFrom) and n.level == 0
                        and (n.module or "").split(".")[0] == "profkit") or (
                        isinstance(n, ast.Import)
                        and any(a.name.split(".")[0] == "profkit" for a in n.names)):
                    out[top] = out.get(top, 0) + 1
    return dict(sorted(out.items()))


def counts(root: Path) -> dict[str, object]:
    pkg = root / "profkit"
    open_sites: list[str] = []
    other_sites: list[str] = []
    runners: list[str] = []
    cluster_starts: list[str] = []
    sizes: list[tuple[int, str]] = []
    for p in _files(pkg):
        rel = p.relative_to(root).as_posix()
        text = p.read_text()
        sizes.append((text.count("\n"), rel))
        tree = ast.parse(text, rel)
        in_rundir = rel == "profkit/rundir.py"
        written = _written_rundirs(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                name = _call_name(node)
                where = f"{rel}:{node.lineno}"
                if not in_rundir and name in RUN_OPEN:
                    open_sites.append(where)
                elif not in_rundir and name in RUN_OTHER:
                    other_sites.append(where)
                elif not in_rundir and name == "RunDir" and id(node) in written:
                    other_sites.append(where)
                if (name == "Cluster" and rel.startswith(("profkit/experiments/",
                                                          "profkit/cli/", "profkit/lab/"))
                        and rel not in ("profkit/experiments/harness.py",
                                        "profkit/cli/cluster.py")):
                    cluster_starts.append(where)
            if isinstance(node, ast.ClassDef) and rel != "profkit/experiments/harness.py":
                called = {_call_name(n) for n in ast.walk(node) if isinstance(n, ast.Call)}
                if called & RUNNER_CALLS:
                    runners.append(f"{rel}:{node.name}")
    fn_imports = function_imports(pkg)
    sizes.sort(reverse=True)
    return {
        "run_creation_sites": {"open_run": len(open_sites), "other": len(other_sites),
                               "other_sites": other_sites},
        "runner_classes": runners,
        "cluster_starts_outside_engine": cluster_starts,
        "imports_inside_functions": fn_imports,
        "imports_inside_functions_total": sum(fn_imports.values()),
        "largest_modules": [f"{rel} {n}" for n, rel in sizes[:6]],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent,
                    help="a profkit checkout (default: this one)")
    ap.add_argument("--json", action="store_true", help="print JSON")
    a = ap.parse_args()
    c = counts(a.root)
    if a.json:
        print(json.dumps(c, indent=1))
        return
    rc = c["run_creation_sites"]
    assert isinstance(rc, dict)
    print(f"run-creation sites: {rc['open_run']} open_run, {rc['other']} other")
    for s in rc["other_sites"]:
        print(f"  other: {s}")
    runners = c["runner_classes"]
    assert isinstance(runners, list)
    print(f"runner classes outside the engine: {len(runners)}")
    for r in runners:
        print(f"  {r}")
    starts = c["cluster_starts_outside_engine"]
    assert isinstance(starts, list)
    print(f"cluster starts outside the engine: {len(starts)}")
    for s in starts:
        print(f"  {s}")
    print(f"profkit imports inside functions: {c['imports_inside_functions_total']} "
          f"{c['imports_inside_functions']}")
    print("largest modules (lines):")
    for m in c["largest_modules"]:  # type: ignore[union-attr]
        print(f"  {m}")


if __name__ == "__main__":
    main()
