"""Workloads, each with a scale factor and its query triple — one mechanism: a TOML
file (:func:`load_workload_file`). The three seeds ship as files in ``profkit/workloads/``
(``get_workload("nested_loop")``); a user's is any path (``get_workload("mine.toml")``,
``"mine.toml#q2"`` for one of its named queries).

- ``nested_loop`` — explain-analyze-87pct-overhead-cut.txt: test1/test2/test3
  and Query-1/2/3.  Scale 1.0 is the seed's row counts (test1 150,000 + 5,000,
  test2 50,000, test3 35,000; Query-1 counts 2,000,000,000 rows).  The plan is
  a nested loop of (test1 ⋈ test3) against a Material over test2, so the work
  grows with scale².
- ``join_sum`` — observer-effect.txt: i1 (1,000,000 rows at 1.0) joined to i2
  (1,000 rows at 1.0), ``sum(i1.i * i2.i)``.
- ``count_star`` — clock-monotonic-coarse-patch.txt: ``count(*)`` over t1
  (10,000,000 rows at 1.0).

Loading is server-side (``INSERT ... SELECT generate_series``) followed by
ANALYZE; random data is seeded so every build sees the same tables.
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from profkit.errors import ProfkitError
from profkit.modes import EXPLAIN_PREFIX, MODES, QUERY_NAMES, ModeError
from profkit.modes import explain_prefix as _explain_prefix


if TYPE_CHECKING:  # the command line reads the workloads without loading libpq
    import psycopg

class WorkloadError(ProfkitError):
    pass


# the modes, their EXPLAIN prefixes and the seed's query names: profkit.modes
SEED_QUERY_NAMES = QUERY_NAMES


def explain_prefix(mode: str, fmt: str | None = None) -> str:
    """The statement prefix of *mode* ('' for plain), with ``FORMAT fmt`` when given."""
    try:
        return _explain_prefix(mode, fmt)
    except ModeError as e:
        raise WorkloadError(str(e)) from None


def _n(base: int, scale: float) -> int:
    return max(1, round(base * scale))


@dataclass(frozen=True)
class Workload:
    name: str
    description: str
    select_sql: str
    setup: Callable[[float], list[str]]
    tables: tuple[str, ...]
    expected: Callable[[float], int] | None = None
    source: str = ""
    #: the file's named queries (name -> SELECT); select_sql is the chosen one
    named: dict[str, str] = field(default_factory=dict, hash=False, compare=False)
    #: the [check] query, when it is not the chosen query itself
    check_sql: str | None = None
    path: str = ""
    sizes_fn: Callable[[float], dict[str, int]] | None = field(default=None, compare=False)
    query_name: str = ""

    def with_query(self, name: str) -> Workload:
        """This workload with its query *name* as the one that is run."""
        if name not in self.named:
            raise WorkloadError(f"workload {self.name!r} has no query {name!r}; its queries: "
                                f"{', '.join(self.named)}")
        return replace(self, select_sql=self.named[name], query_name=name)

    @property
    def checks_select(self) -> bool:
        """Whether the expected answer is that of select_sql (else of check_sql)."""
        return self.check_sql is None and (
            not self.named or self.select_sql == next(iter(self.named.values())))

    @property
    def queries(self) -> dict[str, str]:
        return {m: self.query(m) for m in MODES}

    def query(self, mode: str, fmt: str | None = None) -> str:
        return explain_prefix(mode, fmt) + self.select_sql

    def expected_rows(self, scale: float) -> int | None:
        """The value Query-1 must return at this scale (None if not defined, or when the
        expected answer is that of another query)."""
        if self.expected is None or not self.checks_select:
            return None
        return self.expected(scale)

    def load(self, conn: psycopg.Connection, scale: float = 1.0) -> None:
        check_scale(scale)
        stmts = self.setup(scale)
        for stmt in stmts:
            conn.execute(stmt)
        if self.tables:
            conn.execute("ANALYZE " + ", ".join(self.tables))
        if stmts:
            conn.execute("CHECKPOINT")
        self.check(conn, scale)

    def check(self, conn: psycopg.Connection, scale: float) -> None:
        """Run the [check] query (when it is not the measured query itself, which the
        experiments check on every repetition) and compare with the expected answer."""
        if self.check_sql is None or self.expected is None:
            return
        want = self.expected(scale)
        row = conn.execute(self.check_sql).fetchone()
        got = None if row is None else row[0]
        if got != want and not (isinstance(got, int | float) and float(got) == float(want)):
            raise WorkloadError(f"workload {self.name!r}: check query returned {got!r}, expected "
                                f"{want!r} at scale {scale} ({self.path or 'packaged'})")

    def sizes(self, scale: float) -> dict[str, int]:
        return {} if self.sizes_fn is None else self.sizes_fn(scale)

    def _repr_html_(self) -> str:
        return (
            f"<b>{html.escape(self.name)}</b>: {html.escape(self.description)}"
            f"<pre>{html.escape(self.select_sql)}</pre>"
        )


def check_scale(scale: float) -> None:
    """A scale is a finite number > 0 (NaN and infinity are refused too)."""
    try:
        ok = math.isfinite(float(scale)) and float(scale) > 0
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise WorkloadError(f"scale must be a number > 0 and finite, got {scale!r}")


def check_count(value: int, name: str = "reps", minimum: int = 1) -> None:
    """A repetition count (or any count option) is an integer >= *minimum*."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise WorkloadError(f"{name} must be an integer >= {minimum}, got {value!r}")


def check_args(workload: str | None = None, *, scale: float | None = None,
               reps: int | None = None, mode: str | None = None,
               modes: Sequence[str] = ()) -> Workload | None:
    """Validate a run's arguments before anything expensive (a build, a download).

    Every front door (CLI, magics, library entry points) calls this first, so a bad
    workload, scale, repetition count or mode fails in milliseconds, not after a
    PostgreSQL build.  Returns the workload when one is named.
    """
    wl = get_workload(workload) if workload is not None else None
    if scale is not None:
        check_scale(scale)
    if reps is not None:
        check_count(reps)
    for m in ([mode] if mode is not None else []) + list(modes):
        if m not in EXPLAIN_PREFIX:
            raise WorkloadError(f"unknown mode {m!r}; known: {', '.join(EXPLAIN_PREFIX)}")
    return wl


# ---------------------------------------------------------------------------------------
# workload files (TOML): the three seeds ship in profkit/workloads/, a user's is any path

WORKLOAD_DIR = Path(__file__).resolve().parent.parent / "workloads"
ALLOWED_KEYS = {
    "": ("name", "description", "source", "setup", "tables", "sizes", "queries", "check"),
    "check": ("query", "expected"),
}


def _toml_error(path: Path, e: Exception) -> WorkloadError:
    m = re.search(r"\(at line (\d+), column (\d+)\)", str(e))
    msg = re.sub(r"\s*\(at line \d+, column \d+\)", "", str(e))
    where = f"{path}:{m.group(1)}:{m.group(2)}" if m else str(path)
    return WorkloadError(f"{where}: TOML syntax error: {msg} (fix the file; see "
                         "profkit/workloads/*.toml for examples)")


_EXPR_FUNCS = {"min": min, "max": max, "round": round, "int": int}


def _expr(text: str, names: dict[str, float], where: str) -> int | float:
    """Evaluate an arithmetic expression over the sizes (and ``scale``): + - * / // % **,
    min/max/round/int, numbers and names; nothing else (no attribute, no other call)."""
    import ast
    import operator as op

    ops = {ast.Add: op.add, ast.Sub: op.sub, ast.Mult: op.mul, ast.Div: op.truediv,
           ast.FloorDiv: op.floordiv, ast.Mod: op.mod, ast.Pow: op.pow}

    def ev(n: ast.AST) -> Any:
        if isinstance(n, ast.Expression):
            return ev(n.body)
        if isinstance(n, ast.Constant) and isinstance(n.value, int | float) \
                and not isinstance(n.value, bool):
            return n.value
        if isinstance(n, ast.Name):
            if n.id not in names:
                raise WorkloadError(f"{where}: unknown name {n.id!r} in {text!r}; known: "
                                    f"{', '.join(sorted(names))}")
            return names[n.id]
        if isinstance(n, ast.BinOp) and type(n.op) in ops:
            return ops[type(n.op)](ev(n.left), ev(n.right))
        if isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.USub):
            return -ev(n.operand)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) \
                and n.func.id in _EXPR_FUNCS and not n.keywords:
            return _EXPR_FUNCS[n.func.id](*(ev(a) for a in n.args))
        raise WorkloadError(f"{where}: {text!r} is not an arithmetic expression over the sizes "
                            "(numbers, size names, scale, + - * / // % **, min, max, round)")

    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        raise WorkloadError(f"{where}: {text!r} is not an arithmetic expression") from None
    return ev(tree)


def _str_list(v: Any, key: str, path: Path) -> tuple[str, ...]:
    if isinstance(v, str):
        return (v,)
    if isinstance(v, list) and all(isinstance(x, str) for x in v):
        return tuple(v)
    raise WorkloadError(f"{path}: {key} must be a string or a list of strings")


def load_workload_file(path: str | Path) -> Workload:
    """A workload from a TOML file (the seeds' files are the examples)::

        name = "mine"                 # default: the file's stem
        description = "..."
        setup = ["CREATE TABLE ... generate_series(1, {rows})", ...]   # optional
        tables = ["t"]                # ANALYZE'd after setup (optional)
        [sizes]                       # rows at scale 1.0: {rows} is max(1, round(n * scale))
        rows = 1_000_000
        [queries]                     # named SELECTs; the first is the default
        q1 = "SELECT count(*) FROM t"
        [check]                       # optional: expected answer of check.query
        query = "SELECT ..."          # (default: the first query)
        expected = "rows"             # a number or an expression over sizes and scale

    ``{scale}`` and ``{<size>}`` are replaced in the setup SQL (write ``{{`` for ``{``).
    Without ``setup`` the database is used as it is.
    """
    import tomllib

    p = Path(path).expanduser()
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise WorkloadError(f"workload file {str(path)!r} not found: give a .toml path or a "
                            f"packaged workload ({', '.join(packaged_workloads())})") from None
    except OSError as e:
        raise WorkloadError(f"{p}: cannot read: {e.strerror}") from None
    try:
        doc = tomllib.loads(raw.decode("utf-8", errors="replace"))
    except tomllib.TOMLDecodeError as e:
        raise _toml_error(p, e) from None
    for section, allowed in ALLOWED_KEYS.items():
        table = doc if not section else doc.get(section, {})
        if not isinstance(table, dict):
            raise WorkloadError(f"{p}: [{section}] must be a table")
        bad = [k for k in table if k not in allowed]
        if bad:
            where = f"[{section}] " if section else ""
            raise WorkloadError(f"{p}: unknown key {where}{bad[0]!r}; allowed: {', '.join(allowed)}")
    name = doc.get("name", p.stem)
    if not isinstance(name, str) or not re.match(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$", name):
        raise WorkloadError(f"{p}: name {name!r} may only contain letters, digits and _.-")
    queries = doc.get("queries")
    if not isinstance(queries, dict) or not queries or not all(
            isinstance(v, str) and v.strip() for v in queries.values()):
        raise WorkloadError(f"{p}: give at least one query: [queries] name = \"SELECT ...\"")
    sizes_base = doc.get("sizes", {})
    if not isinstance(sizes_base, dict) or not all(
            isinstance(v, int | float) and not isinstance(v, bool) and v > 0
            for v in sizes_base.values()):
        raise WorkloadError(f"{p}: [sizes] maps names to row counts > 0 at scale 1.0")
    setup_sql = _str_list(doc.get("setup", []), "setup", p)
    tables = _str_list(doc.get("tables", []), "tables", p)
    for t in tables:
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_.]*$", t):
            raise WorkloadError(f"{p}: table name {t!r} is not a plain identifier")
    check = doc.get("check", {})
    check_sql = check.get("query")
    if check_sql is not None and not isinstance(check_sql, str):
        raise WorkloadError(f"{p}: [check] query must be a string")
    expected_raw = check.get("expected")
    if expected_raw is not None and (isinstance(expected_raw, bool) or
                                     not isinstance(expected_raw, int | float | str)):
        raise WorkloadError(f"{p}: [check] expected must be a number or an expression string")

    def sizes(scale: float) -> dict[str, int]:
        return {k: _n(v, scale) for k, v in sizes_base.items()}

    def setup(scale: float) -> list[str]:
        params: dict[str, Any] = {"scale": scale, **sizes(scale)}
        out = []
        for stmt in setup_sql:
            try:
                out.append(stmt.format_map(params))
            except KeyError as e:
                raise WorkloadError(f"{p}: setup uses {{{e.args[0]}}}, which is not a size; known: "
                                    f"{', '.join(params)} (write {{{{ for a literal brace)") from None
            except (ValueError, IndexError) as e:
                raise WorkloadError(f"{p}: setup statement {stmt[:60]!r}: {e}") from None
        return out

    expected = None
    if expected_raw is not None:
        where = f"{p}: [check] expected"
        if isinstance(expected_raw, str):
            _expr(expected_raw, {"scale": 1.0, **sizes(1.0)}, where)  # fails now, not mid-run

        def expected(scale: float) -> int | float:
            if not isinstance(expected_raw, str):
                return expected_raw
            v = _expr(expected_raw, {"scale": scale, **sizes(scale)}, where)
            return int(v) if isinstance(v, float) and v.is_integer() else v

    setup(1.0)  # an unknown {placeholder} fails when the file is read
    first = next(iter(queries.values()))
    return Workload(
        name, str(doc.get("description", "")), first, setup, tables, expected,
        str(doc.get("source", "")), named=dict(queries), check_sql=check_sql,
        path=str(p.resolve()), sizes_fn=sizes,
    )


_SEED_ORDER = ("nested_loop", "join_sum", "count_star")


def packaged_workloads() -> list[str]:
    names = {f.stem for f in WORKLOAD_DIR.glob("*.toml")}
    return [n for n in _SEED_ORDER if n in names] + sorted(names - set(_SEED_ORDER))


def _is_path(name: str) -> bool:
    return name.endswith(".toml") or "/" in name


def get_workload(name: str, query: str | None = None) -> Workload:
    """A packaged workload by name (``nested_loop``…) or a user's TOML file by path;
    ``NAME#QUERY`` (or *query*) picks one of its named queries (default: the first)."""
    if not isinstance(name, str):
        raise WorkloadError(f"workload must be a name or a .toml path, got {name!r}")
    base, sep, q = name.rpartition("#") if "#" in name else (name, "", "")
    query = query or (q if sep else None)
    if _is_path(base):
        f = Path(base).expanduser()
    else:
        f = WORKLOAD_DIR / f"{base}.toml"
        if not base or not f.is_file():
            raise WorkloadError(f"unknown workload {base!r}; known: "
                                f"{', '.join(packaged_workloads())} (or a FILE.toml)")
    try:
        st = f.stat()
        stamp: tuple = (str(f.resolve()), st.st_mtime_ns, st.st_size)
    except OSError:
        stamp = ()
    wl = _LOADED.get(stamp) if stamp else None
    if wl is None:
        wl = load_workload_file(f)  # a missing or unreadable file: its WorkloadError
        if stamp:
            _LOADED[stamp] = wl
    return wl.with_query(query) if query else wl


#: workloads read from their files, by (path, mtime, size): the same file gives the same
#: object, an edited one is read again
_LOADED: dict[tuple, Workload] = {}


def workload_label(spec: str) -> str:
    """A file-name-safe label of a workload spec: its name (and query when one is chosen)."""
    wl = get_workload(spec)
    return wl.name + (f"-{wl.query_name}" if wl.query_name else "")


def workload_spec(workload: str, query: str | None) -> str:
    """The one string (``FILE.toml#QUERY``) that names a workload and one of its queries,
    as every front door passes it on; checked now."""
    spec = f"{workload}#{query}" if query else workload
    get_workload(spec)
    return spec


class _Seeds(dict):
    """``WORKLOADS[name]``: the packaged workloads, loaded from their files."""

    def __init__(self) -> None:
        super().__init__({n: get_workload(n) for n in packaged_workloads()})


WORKLOADS: dict[str, Workload] = _Seeds()
