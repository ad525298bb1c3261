"""The pipeline's stage rules, checked by walking every import in the package (ast).

Imports inside functions count too: a lazy import is still a dependency.
"""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import profkit

PKG = Path(profkit.__file__).parent
BASE = {"profkit.errors", "profkit.paths", "profkit.processes", "profkit.tables"}


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


# --------------------------------------------------------------------------- front doors

#: What a front door (cli/, lab/) may import besides experiments/ and render/: the base
#: modules, and the vocabulary (modes, EXPLAIN prefixes, workload names and their checks;
#: in pg/workloads until it has a base module of its own).
FRONT_DOOR_BASE = {"profkit", "profkit.errors", "profkit.paths", "profkit.tables",
                   "profkit.progress", "profkit.processes", "profkit.modes", "profkit.pg.workloads"}

#: Front-door imports outside that rule, each with its reason.
FRONT_DOOR_EXCEPTIONS: dict[str, dict[str, str]] = {
    "profkit.cli.parse": {
        "profkit.stackcollapse": "`parse perf-script` folds through the compiled drop-in's path",
        "profkit.parse.perf_script": "the parse commands' job is parsing files",
        "profkit.parse.gprof": "the parse commands' job is parsing files",
        "profkit.parse.callgrind": "the parse commands' job is parsing files",
        "profkit.parse.explain": "the parse commands' job is parsing files",
        "profkit.analyze.predict": "`parse explain` prints what a pasted plan predicts "
                                   "(arithmetic on the plan: no experiment runs)",
    },
    "profkit.cli.build": {"profkit.pg.build": "the build command's job is the build itself"},
    "profkit.cli.cluster": {
        "profkit.pg.build": "the cluster command starts a cluster of a build",
        "profkit.pg.cluster": "the cluster command's job is the cluster itself",
    },
    "profkit.cli.regress": {
        "profkit.patches": "the regress command runs the patch presets' regression tests",
        "profkit.pg.build": "the regress command runs a build's own regression tests",
        "profkit.pg.regress": "the regress command's job is pg_regress",
    },
    "profkit.lab.notebook": {
        "profkit.rundir": "the notebook's Run reads run directories (load_run, list_runs)",
        "profkit.pg.build": "available_builds: which builds a notebook can use",
        "profkit.analyze.stats": "Comparison: the notebook's view of compare_chain",
        "profkit.analyze": "as profkit.analyze.stats",
    },
}


def _front_door(mod: str) -> bool:
    return _in(mod, "cli") or _in(mod, "lab")


def test_front_doors_import_only_experiments_render_and_base_modules():
    """cli/ and lab/ call experiments/ and render/ (and each other's modules), never
    collect/, parse/, analyze/ or pg/ — except where FRONT_DOOR_EXCEPTIONS says why."""
    # export/ writes a run's stacks in other tools' formats: a renderer of its own
    allowed_stages = ("experiments", "render", "export", "cli", "lab")
    bad: dict[str, list[str]] = {}
    for m, deps in _graph().items():
        if not _front_door(m):
            continue
        extra = sorted(i for i in deps if i not in FRONT_DOOR_BASE
                       and not any(_in(i, s) for s in allowed_stages)
                       and i not in FRONT_DOOR_EXCEPTIONS.get(m, {}))
        if extra:
            bad[m] = extra
    assert bad == {}


#: The only front doors that reach parse/ (their job is parsing files). None reaches
#: collect/: collecting is an experiment's (experiments/profile, probe, cell...).
PARSE_FRONT_DOORS = {"profkit.cli.parse"}


def test_front_doors_never_import_collect_or_parse_but_the_parse_commands():
    bad = {m: sorted(i for i in deps if _in(i, "collect")
                     or (_in(i, "parse") and m not in PARSE_FRONT_DOORS))
           for m, deps in _graph().items() if _front_door(m)}
    assert {m: d for m, d in bad.items() if d} == {}


def test_no_front_door_starts_a_cluster_but_the_cluster_command():
    """Clusters are the engine's (harness.Session) or an experiment's: a command that
    measures calls its experiment with a build name, and the experiment's session starts,
    loads and stops the cluster. Only `profkit cluster` (whose job is the cluster) and
    the notebook's cell registry keep one running."""
    g = _graph()
    users = sorted(m for m, deps in g.items() if _front_door(m) and "profkit.pg.cluster" in deps)
    assert users == ["profkit.cli.cluster"]


def test_front_door_exceptions_are_still_needed():
    """An exception the code no longer needs is struck from the list."""
    g = _graph()
    stale = {m: sorted(set(why) - g.get(m, set())) for m, why in FRONT_DOOR_EXCEPTIONS.items()}
    assert {m: s for m, s in stale.items() if s} == {}


# --------------------------------------------------------------------------- imports in functions

#: Imports of profkit modules inside functions, per package, at most (a package not
#: listed: none). They hide the dependency graph, so profkit imports sit at the top of a
#: module, except
#: - cli/: every command module imports its experiment inside the command function, so
#:   `profkit --version` and `--help` start fast (no pandas, psycopg, matplotlib; what
#:   `profkit --help` loads anyway — profkit.errors, cli.common — is imported at the top);
#: - profkit/__init__.py: the IPython extension hooks (IPython is optional);
#:   __main__.py and stackcollapse.py: `profkit --version`/`--help` and the
#:   `profkit-stackcollapse-perf` script start fast (the compiled folder and the full
#:   parser imported only when used);
#: - parse/: the folding path stays free of pandas (parse/folded's tables, parse's
#:   load_stacks), for the stackcollapse script's start-up time;
#: - collect/: bpf's handle on profkit.processes (its `run` name is taken by the function).
#: experiments/ has none. The ceilings are today's counts: lower one when you move an
#: import to the top.
FUNCTION_IMPORT_CEILING = {"(top)": 7, "cli": 53, "collect": 1, "parse": 3}


def _counter() -> Any:
    """scripts/architecture_counts.py (the one counter; its report shows the same
    figures), loaded as a module."""
    import importlib.util

    path = Path(__file__).resolve().parent.parent / "scripts" / "architecture_counts.py"
    spec = importlib.util.spec_from_file_location("pk_architecture_counts", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _function_imports() -> dict[str, int]:
    """Imports of profkit modules inside function bodies, per package."""
    return _counter().function_imports(PKG)


def test_every_run_folder_is_made_by_open_run():
    """One run lifecycle: outside profkit/rundir.py no run folder is made any other way
    than ``rundir.open_run`` (collectors take the run from their caller)."""
    sites = _counter().counts(PKG.parent)["run_creation_sites"]
    assert sites["other"] == 0, sites["other_sites"]
    assert sites["open_run"] > 0


def test_profkit_imports_inside_functions_stay_under_their_ceiling():
    counts = _function_imports()
    over = {pkg: (n, FUNCTION_IMPORT_CEILING.get(pkg, 0)) for pkg, n in counts.items()
            if n > FUNCTION_IMPORT_CEILING.get(pkg, 0)}
    assert over == {}, f"(count, ceiling) per package: {over}"
