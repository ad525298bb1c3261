"""The server's non-default settings, as a run's provenance records them.

The machine and tool facts are :mod:`profkit.machine` (a base module, so that
:mod:`profkit.rundir` reads them without calling into the collectors); the run directory
itself (create, provenance.json, load) is :mod:`profkit.rundir`.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from profkit.machine import machine_info, tool_version, virtualization

if TYPE_CHECKING:
    import psycopg


# The machine facts live in the base module profkit.machine (rundir reads them there);
# these names stay importable from here.
__all__ = ["machine_info", "server_settings", "tool_version", "virtualization"]


def server_settings(conn: psycopg.Connection) -> dict[str, str]:
    """The server's settings that are not at their built-in default (plus version)."""
    rows = conn.execute(
        "SELECT name, setting FROM pg_settings WHERE source NOT IN ('default', 'override') "
        "ORDER BY name").fetchall()
    out = {str(n): str(s) for n, s in rows}
    out["server_version"] = str(conn.execute("SHOW server_version").fetchone()[0])
    return out


