"""profkit: profile PostgreSQL's executor instrumentation (EXPLAIN ANALYZE overhead)."""

__version__ = "0.1.0"


def load_ipython_extension(ipython):
    from profkit.lab.magics import load_ipython_extension as _load

    _load(ipython)


def unload_ipython_extension(ipython):
    from profkit.lab.magics import unload_ipython_extension as _unload

    _unload(ipython)
