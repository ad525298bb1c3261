"""profkit: profile PostgreSQL's executor instrumentation (EXPLAIN ANALYZE overhead)."""

__version__ = "0.1.0"


def load_ipython_extension(ipython):  # pragma: no cover - exercised in notebooks
    from profkit.magics import load_ipython_extension as _load

    _load(ipython)
