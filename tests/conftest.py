"""Shared fixtures: a real vanilla PostgreSQL 18 build and a running cluster.

The build is cached outside the clone (see profkit.paths), so only the first
run on a machine compiles PostgreSQL.
"""
from __future__ import annotations

import os

import pytest



def pytest_configure(config):
    # Tests never write into the clone's profiles/ or flamegraphs/: a run that
    # does not choose its own folder lands in a temporary one.
    import tempfile

    base = tempfile.mkdtemp(prefix="profkit-tests-")
    os.environ.setdefault("PROFKIT_PROFILES", os.path.join(base, "profiles"))
    os.environ.setdefault("PROFKIT_FLAMEGRAPHS", os.path.join(base, "flamegraphs"))


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
