"""The pipeline's stage rules, checked by walking every import in the package (ast).

Imports inside functions count too: a lazy import is still a dependency.
"""
from __future__ import annotations

import ast
from pathlib import Path

import profkit

PKG = Path(profkit.__file__).parent
BASE = {"profkit.errors", "profkit.paths", "profkit.run", "profkit.tables"}


def _module(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    """Every profkit module *path* imports (``from profkit import x`` counts as profkit.x)."""
    mod = _module(path)
    pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            out.add(target)
            out.update(f"{target}.{a.name}" for a in node.names)
    return {m for m in out if m == "profkit" or m.startswith("profkit.")}


def _graph() -> dict[str, set[str]]:
    mods = {_module(p) for p in PKG.rglob("*.py")}
    graph = {}
    for p in PKG.rglob("*.py"):
        # keep only names that are modules or packages (drop imported functions/classes)
        graph[_module(p)] = {m for m in _imports(p) if m in mods}
    return graph


def _in(mod: str, stage: str) -> bool:
    return mod == f"profkit.{stage}" or mod.startswith(f"profkit.{stage}.")


def test_the_walk_sees_imports():
    g = _graph()
    assert "profkit.experiments.harness" in g["profkit.experiments.bench"]
    assert "profkit.cli.bench" in g["profkit.cli"]
    assert "profkit.rundir" in g["profkit.collect.perf"]


def test_parse_imports_only_base_modules():
    bad = {m: sorted(i for i in deps if not (_in(i, "parse") or i in BASE or i == "profkit"))
           for m, deps in _graph().items() if _in(m, "parse")}
    assert {m: d for m, d in bad.items() if d} == {}


def test_analyze_imports_no_collect_render_experiments_or_front_doors():
    later = ("collect", "render", "experiments", "cli", "lab")
    bad = {m: sorted(i for i in deps if any(_in(i, s) for s in later))
           for m, deps in _graph().items() if _in(m, "analyze")}
    assert {m: d for m, d in bad.items() if d} == {}


def test_collect_does_not_import_analyze_render_or_experiments():
    bad = {m: sorted(i for i in deps if any(_in(i, s) for s in ("analyze", "render",
                                                                   "experiments", "cli", "lab")))
           for m, deps in _graph().items() if _in(m, "collect")}
    assert {m: d for m, d in bad.items() if d} == {}


def test_render_does_not_reach_back_into_experiments_or_front_doors():
    bad = {m: sorted(i for i in deps if any(_in(i, s) for s in ("experiments", "cli", "lab")))
           for m, deps in _graph().items() if _in(m, "render")}
    assert {m: d for m, d in bad.items() if d} == {}


def test_nothing_below_cli_imports_cli():
    bad = {m: sorted(i for i in deps if _in(i, "cli"))
           for m, deps in _graph().items() if not _in(m, "cli") and m != "profkit.__main__"}
    assert {m: d for m, d in bad.items() if d} == {}


def test_experiments_do_not_import_front_doors():
    bad = {m: sorted(i for i in deps if _in(i, "cli") or _in(i, "lab"))
           for m, deps in _graph().items() if _in(m, "experiments")}
    assert {m: d for m, d in bad.items() if d} == {}
