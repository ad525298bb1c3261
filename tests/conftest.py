"""Shared fixtures: a real vanilla PostgreSQL 18 build and a running cluster.

The build is cached outside the clone (see profkit.paths), so only the first
run on a machine compiles PostgreSQL.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

# Every build the suite uses, in the order they are made: vanilla first, then the
# variants that share most of its objects (ccache hits), the -pg build (all misses), the
# PostgreSQL 19 builds, and the one clang build (all misses) last.
BUILD_ORDER = ("vanilla", "step1", "step2", "step3", "step4", "step5", "step6", "coarse_clock",
               "tsc_clock", "sampled_timing", "fast_timing", "node_marker", "gprof",
               "step3+gprof", "pg19/vanilla", "pg19/step1", "pg19/step2", "pg19/step3",
               "pg19/step4", "pg19/step5", "pg19/step6", "pg19/fast_timing", "step5@clang",
               "vanilla@layout1", "vanilla@layout2")
# Session/module fixtures that stand for a build.
FIXTURE_BUILDS = {"vanilla_build": "vanilla", "gprof_cluster": "gprof"}


def needed_builds(items) -> list[str]:
    """The builds the selected tests need: ``@pytest.mark.builds(...)`` plus vanilla for
    any test that (transitively) uses the ``vanilla_build`` fixture."""
    names: set[str] = set()
    for item in items:
        names |= _item_builds(item)
    unknown = names - set(BUILD_ORDER)
    if unknown:
        raise pytest.UsageError(f"tests ask for builds not in conftest.BUILD_ORDER: {sorted(unknown)}")
    return [n for n in BUILD_ORDER if n in names]


def _item_builds(item) -> set[str]:
    names: set[str] = set()
    for m in item.iter_markers("builds"):
        names.update(m.args)
    for fixture, build in FIXTURE_BUILDS.items():
        if fixture in getattr(item, "fixturenames", ()):
            names.add(build)
    return names


# make test runs the suite in two phases (docs/testing.md): first every test not marked
# ``alone`` under pytest-xdist, one worker per core, each module on one worker
# (``--phase shared --dist loadfile``), then the tests marked ``alone`` in one process with
# nothing else running (``--phase alone``): they assert times measured on this machine,
# which a neighbour's load would move.
PHASES = ("all", "shared", "alone")
# The longest modules first (measured: --durations=0 of a whole run), so no worker is
# left with a long one at the end; the rest keep their order.
LONGEST_FIRST = ("test_notebooks.py", "test_headline.py", "test_rows_only_path.py",
                 "test_cli_commands.py", "test_same_answers.py", "test_cold_path.py",
                 "test_install.py", "test_attach.py", "test_flamediff_pg.py",
                 "test_ltrace_bpf.py", "test_custom_build.py", "test_collect_gprof.py",
                 "test_magics.py")


def pytest_addoption(parser):
    parser.addoption("--phase", choices=PHASES, default="all",
                     help="shared: the tests that may share the machine (make test runs "
                     "them under pytest-xdist); alone: the tests marked alone (times "
                     "measured here), to run with nothing else running; all (default)")


def _module(item) -> str:
    return item.nodeid.split("::", 1)[0].rsplit("/", 1)[-1]


def _select_phase(config, items) -> None:
    phase = config.getoption("--phase")
    if phase == "all":
        return
    keep, drop = [], []
    for it in items:
        alone = it.get_closest_marker("alone") is not None
        (keep if alone == (phase == "alone") else drop).append(it)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def _longest_first(items) -> None:
    """Under xdist: modules whose builds are made first stay first (as _order_by_builds
    has them); among them, the longest first (LONGEST_FIRST)."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    first = {name: i for i, name in enumerate(LONGEST_FIRST)}
    rank = _missing_build_rank(items)
    order = {id(it): i for i, it in enumerate(items)}
    items.sort(key=lambda it: (rank[_module(it)], first.get(_module(it), len(first)),
                               order[id(it)]))


def _missing_build_rank(items) -> dict[str, int]:
    """Per module: the place in BUILD_ORDER of the last build it needs that is not made
    yet (-1 when all are: a warm cache ranks every module alike)."""
    from profkit.pg.build import find_build

    missing: dict[str, bool] = {}
    out: dict[str, int] = {}
    for it in items:
        r = -1
        for n in _item_builds(it):
            if n not in missing:
                try:
                    missing[n] = find_build(n) is None
                except Exception:  # noqa: BLE001 - pytest_collection_finish says why
                    missing[n] = True
            if missing[n]:
                r = max(r, BUILD_ORDER.index(n) if n in BUILD_ORDER else 0)
        out[_module(it)] = max(out.get(_module(it), -1), r)
    return out


def pytest_collection_modifyitems(session, config, items):
    """Tests that need only the first builds run first, so they overlap the later
    builds (see pytest_collection_finish).  Whole modules move, never single tests, so a
    module's fixtures are set up once; pytest's own order is kept inside each group."""
    _select_phase(config, items)
    _order_by_builds(items)
    _longest_first(items)


def _order_by_builds(items) -> None:
    if os.environ.get("PROFKIT_TEST_BUILDS_FIRST") == "1":
        return
    rank = {n: i for i, n in enumerate(BUILD_ORDER)}
    module_rank: dict[str, int] = {}
    for item in items:
        key = item.nodeid.split("::", 1)[0]
        r = max((rank.get(n, 0) for n in _item_builds(item)), default=-1)
        module_rank[key] = max(module_rank.get(key, -1), r)
    order = {id(it): i for i, it in enumerate(items)}
    items.sort(key=lambda it: (module_rank[it.nodeid.split("::", 1)[0]], order[id(it)]))


class _BackgroundBuilds:
    """The builds after the first, made by a `profkit build` child (one compile at a
    time, the next build's configure beside it: profkit.pg.build.get_builds) while the
    tests that need only the first run.  A test waits for its own builds."""

    def __init__(self, names: list[str], log: Path) -> None:
        import subprocess
        import sys

        self.names = names
        self.log = log
        self._f = open(log, "w")  # noqa: SIM115 - closed in stop()
        # nice: the tests running meanwhile keep the CPU they ask for; the build takes the rest
        self.proc = subprocess.Popen(
            ["nice", "-n", "10", sys.executable, "-m", "profkit", "build", *names],
            stdout=self._f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def wait_for(self, name: str, say) -> None:
        from profkit.pg.build import find_build

        if name not in self.names or find_build(name) is not None:
            return
        t0 = time.monotonic()
        say(f"waiting for build {name} (background: {self.log})")
        while find_build(name) is None and self.proc.poll() is None:
            time.sleep(2)
        if find_build(name) is None:
            tail = self.log.read_text(errors="replace")[-3000:]
            pytest.fail(f"build {name!r} failed in the background (log: {self.log}):\n{tail}",
                        pytrace=False)
        say(f"build {name} ready after {time.monotonic() - t0:.0f} s of waiting")

    def stop(self) -> None:
        stopped = self.proc.poll() is None
        if stopped:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except Exception:
                self.proc.kill()
                self.proc.wait()
        self._f.close()
        # the user's cache keeps the log only of a background build that failed
        if stopped or self.proc.returncode == 0:
            self.log.unlink(missing_ok=True)


_BACKGROUND: _BackgroundBuilds | None = None


def pytest_collection_finish(session):
    """Build what the selected tests need, in dependency order, with progress on the
    terminal: a test never skips because a build is missing, and a cold cache shows what
    it is doing instead of a silent half hour.  The first build is made before any test;
    the others are made in the background while the tests that need only the first run
    (PROFKIT_TEST_BUILDS_FIRST=1 makes them all first, as before)."""
    global _BACKGROUND
    if session.config.option.collectonly:
        return
    names = needed_builds(session.items)
    if not names:
        return
    from profkit.pg.build import find_build, get_build

    tr = session.config.pluginmanager.get_plugin("terminalreporter")
    worker = os.environ.get("PYTEST_XDIST_WORKER")

    def say(msg: str) -> None:
        if worker:  # an xdist worker's terminal is not shown; its stderr is
            import sys

            print(f"[builds {worker}] {msg}", file=sys.__stderr__, flush=True)
        elif tr is not None:
            tr.write_line(f"[builds] {msg}")

    from profkit.errors import ProfkitError

    missing = []
    for n in names:
        try:  # a build's key needs its source: pg19/... may have none here
            if find_build(n) is None:
                missing.append(n)
        except ProfkitError as e:
            _stop(say, f"build {n!r} cannot be made, so the tests that need it cannot run:"
                  f"\n{e}")
    say(f"{len(names)} builds needed ({', '.join(names)}); "
        f"{len(missing)} to build{': ' + ', '.join(missing) if missing else ''}")

    # the alone phase makes them all first: a build in the background would share the
    # machine with the tests that time it
    first_only = (os.environ.get("PROFKIT_TEST_BUILDS_FIRST") != "1"
                  and session.config.getoption("phase") != "alone")
    now = names[:1] if first_only else names
    for i, n in enumerate(now, 1):
        t0 = time.monotonic()
        try:
            get_build(n, progress=say)
        except ProfkitError as e:  # a build the tests need failed: nothing can pass
            _stop(say, f"build {n!r} failed, so the tests that need it cannot run:\n{e}")
        if n in missing:
            say(f"[{i}/{len(names)}] {n} ready in {time.monotonic() - t0:.0f} s")
    later = [n for n in names[len(now):] if n in missing]
    if later:
        from profkit import paths

        # each xdist worker has its own (``worker`` above)
        log = paths.sub("logs") / (f"test-builds-{time.strftime('%Y%m%d-%H%M%S')}"
                                   f"{'-' + worker if worker else ''}.log")
        say(f"building in the background, one compile at a time: {', '.join(later)} "
            f"(log: {log})")
        _BACKGROUND = _BackgroundBuilds(later, log)
        session.config._profkit_say = say


def _stop(say, msg: str) -> None:
    """End the run with *msg*.  An xdist worker's exit reaches the terminal only as its
    crash, so the worker says why on its stderr first."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        say(msg)
    pytest.exit(msg, returncode=1)


def pytest_runtest_setup(item):
    if _BACKGROUND is None:
        return
    say = getattr(item.config, "_profkit_say", print)
    for n in sorted(_item_builds(item), key=lambda n: BUILD_ORDER.index(n) if n in BUILD_ORDER else 0):
        _BACKGROUND.wait_for(n, say)


def pytest_sessionfinish(session, exitstatus):
    if _BACKGROUND is not None:
        _BACKGROUND.stop()


# what this pytest process made in the temp directory, removed when it ends
_OWN_TEMP: list[Path] = []


def _terminated(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config):
    # SIGTERM (a CI job's time limit, `timeout`, `kill`) ends the run as Ctrl-C does: the
    # test running is interrupted, no other starts, the fixtures' teardowns and the
    # clean-up below run.  Python's default dies at once, leaving clusters and folders
    # behind; profkit's own handler (set later, it calls this one after stopping what
    # profkit started) alone would fail one test and go on to the next.
    import signal
    import threading

    if threading.current_thread() is threading.main_thread():
        if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _terminated)
        # A background job (`make test &`, nohup, some CI runners) starts with SIGINT
        # ignored, and an xdist worker then ignores the interruption its controller sends
        # when it stops (execnet's interrupt_main does nothing to an ignored SIGINT): the
        # worker is killed after 10 s, its teardowns never run.  Ctrl-C's KeyboardInterrupt
        # is pytest's own way to stop; the tests' children get SIGINT's default again.
        if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
            signal.signal(signal.SIGINT, signal.default_int_handler)
    # Tests never write into the clone's profiles/ or flamegraphs/: a run that
    # does not choose its own folder lands in a temporary one (an xdist worker inherits
    # its controller's, and the controller removes it at the end).
    import tempfile

    if not {"PROFKIT_PROFILES", "PROFKIT_FLAMEGRAPHS"} <= set(os.environ):
        base = tempfile.mkdtemp(prefix="profkit-tests-")
        _OWN_TEMP.append(Path(base))
        os.environ.setdefault("PROFKIT_PROFILES", os.path.join(base, "profiles"))
        os.environ.setdefault("PROFKIT_FLAMEGRAPHS", os.path.join(base, "flamegraphs"))
    # pg19/... builds: the PostgreSQL 19 source of the shared test data (Debian's
    # experimental suite is listed but not served here, see its README)
    if PG19_TARBALL.is_file():
        os.environ.setdefault("PROFKIT_PG19_SOURCE", f"tarball:{PG19_TARBALL}")
    # Named builds the tests define (test-pk15-double-clock, unique names) live in their
    # own specs folder, never among the user's (`profkit build --list`); their compiled
    # trees stay cached, so a rerun does not rebuild them.
    if "PROFKIT_SPECS" not in os.environ:
        from profkit import paths

        os.environ["PROFKIT_SPECS"] = str(paths.cache_dir() / "test-specs")


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """xdist's controller: the run id its workers share the callgrind counts under
    (:func:`_shared_by_workers`), so that it removes their folder at the end."""
    folder = _counts_folder(node.workerinput["testrunuid"])
    if folder not in _OWN_TEMP:
        _OWN_TEMP.append(folder)


def pytest_unconfigure(config):
    import shutil

    for d in _OWN_TEMP:
        shutil.rmtree(d, ignore_errors=True)


# resolved as profkit resolves a source path: ../shared may be a link (the tests compare
# the source profkit prints with this path)
PG19_TARBALL = (Path(__file__).resolve().parent.parent.parent / "shared" / "pg-sources"
                / "postgresql-19beta1.tar.bz2").resolve()


# Small scales keep the suite quick; every figure in tests derives from them.
NESTED_LOOP_SCALE = float(os.environ.get("PROFKIT_TEST_NL_SCALE", "0.02"))
JOIN_SUM_SCALE = float(os.environ.get("PROFKIT_TEST_JS_SCALE", "0.02"))


@pytest.fixture(scope="session")
def vanilla_build():
    from profkit.pg.build import get_build

    return get_build("vanilla", progress=print)


@pytest.fixture(scope="session")
def pg_cluster(vanilla_build):
    from profkit.pg.cluster import Cluster

    with Cluster(vanilla_build, name="test-vanilla") as cl:
        yield cl


@pytest.fixture(scope="session")
def _nested_loop_loaded(pg_cluster):
    from profkit.pg.workloads import get_workload

    with pg_cluster.connect() as conn:
        get_workload("nested_loop").load(conn, NESTED_LOOP_SCALE)
    return NESTED_LOOP_SCALE


@pytest.fixture(scope="session")
def _join_sum_loaded(pg_cluster):
    from profkit.pg.workloads import get_workload

    with pg_cluster.connect() as conn:
        get_workload("join_sum").load(conn, JOIN_SUM_SCALE)
    return JOIN_SUM_SCALE


@pytest.fixture
def nested_loop_conn(pg_cluster, _nested_loop_loaded):
    with pg_cluster.connect() as conn:
        yield conn


@pytest.fixture
def join_sum_conn(pg_cluster, _join_sum_loaded):
    with pg_cluster.connect() as conn:
        yield conn


def kept_reps(run_dir) -> dict[tuple[str, str], set[int]]:
    """(build, mode) -> the repetitions of a bench run whose executions its summary counts:
    those whose vCPU calibrations were not slow (stats.vcpu_adjust, the `cpu_kept_ms`
    rule)."""
    import pandas as pd

    from profkit.analyze import stats

    adjusted, _ = stats.vcpu_adjust(pd.read_csv(Path(run_dir) / "timings.csv"))
    kept = adjusted.dropna(subset=["cpu_kept_ms"]).groupby(["build", "mode"])["rep"]
    return {k: {int(r) for r in v} for k, v in kept}


def kept_counts(run_dir) -> dict[tuple[str, str], int]:
    """(build, mode) -> how many executions of a bench run its summary's ``n`` counts."""
    return {k: len(v) for k, v in kept_reps(run_dir).items()}


def prefetch_counts(request, keys_of) -> None:
    """Count ahead, one callgrind session per core, every cell the selected tests of
    *request*'s module will ask ``measure_once`` for (``keys_of(item)``: its
    (build, workload, scale, modes) keys, [] for a test it does not concern).  The tests
    then read the same counts from the cache; only the cells of selected tests are
    counted (``-k`` narrows the work too)."""
    keys = [k for item in request.session.items
            if getattr(item, "module", None) is request.module for k in keys_of(item)]
    headline_module().measure_many(keys)


def benchmark_module(name: str):
    """benchmarks/<name>.py as a module, loaded once per session (tests share the
    scripts' code: their parsers, their probes, their counts)."""
    import importlib.util
    import sys

    key = f"pk_{name}"
    if key not in sys.modules:
        path = Path(__file__).resolve().parent.parent / "benchmarks" / f"{name}.py"
        spec = importlib.util.spec_from_file_location(key, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[key] = mod  # before exec: its dataclasses look it up
        spec.loader.exec_module(mod)
    return sys.modules[key]


def headline_module():
    """benchmarks/headline.py (the tests that hold instruction counts to the committed
    matrix share its code and its counts).  Under xdist its workers share the counts of
    this run too: each cell is counted once, by the first worker that asks."""
    mod = benchmark_module("headline")
    run_id = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if run_id and not getattr(mod.measure, "_shared_by_workers", False):
        mod.measure = _shared_by_workers(mod, mod.measure, run_id)
    return mod


def _counts_folder(run_id: str) -> Path:
    """Where the xdist workers of run *run_id* share their callgrind counts."""
    import tempfile

    return Path(tempfile.gettempdir()) / f"profkit-test-counts-{run_id}"


def _shared_by_workers(mod, measure, run_id: str):
    """*measure* (benchmarks/headline.py), its counts shared by this run's xdist workers:
    a JSON file per cell in a folder of this run, written by the worker that counted it
    while it holds the cell's lock; a worker asking for a cell another is counting waits
    for it.  Only within one run: the next run counts again."""
    import dataclasses
    import fcntl
    import hashlib
    import json

    folder = _counts_folder(run_id)
    folder.mkdir(exist_ok=True)

    def shared(build, workload, scale, modes=mod.MODES, say=None, settings=None):
        if settings:  # not a cell of the matrix: counted here
            return measure(build, workload, scale, modes, say, settings)
        key = json.dumps([build, workload, float(scale), list(modes)])
        f = folder / hashlib.sha256(key.encode()).hexdigest()[:16]
        with open(f.with_suffix(".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if f.with_suffix(".json").is_file():
                return mod.Count(**json.loads(f.with_suffix(".json").read_text()))
            c = measure(build, workload, scale, modes, say)
            f.with_suffix(".tmp").write_text(json.dumps(dataclasses.asdict(c)))
            f.with_suffix(".tmp").rename(f.with_suffix(".json"))
            return c

    shared._shared_by_workers = True
    return shared


def moved_from_committed(row, n: int, scale: float, label: str,
                         tolerance_pct: float) -> str | None:
    """A count *n* against its committed headline *row* (same scale): None when within
    *tolerance_pct*, else the line the test reports."""
    assert float(row["scale"]) == scale
    want = int(row["instructions"])
    dev = (n - want) / want * 100
    if abs(dev) <= tolerance_pct:
        return None
    return f"{label}: {n:,} instructions, committed {want:,} ({dev:+.3f} %)"

