"""Throwaway PostgreSQL clusters for a build.

``with Cluster(build) as cl:`` copies the build's initdb template (initdb runs once per
build, on first use) into a fresh directory, starts the
postmaster directly (so its pid is ours), waits until it accepts connections,
and on exit — normal, exception or Ctrl-C — stops it by pid (SIGINT = fast
shutdown, escalating) and removes the directory unless ``keep=True``.

The socket lives in a private directory (mode 0700); TCP is off unless asked.
initdb and postgres refuse to run as root, so when profkit runs as root they
run as the unprivileged OS user ``profkit`` (created if needed).
"""
from __future__ import annotations

import hashlib
import html
import json
import os
import pwd
import re
import shutil
import signal
import socket
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psycopg

from profkit import paths
from profkit.errors import ClusterError
from profkit.pg.build import Build
from profkit.processes import Background, OSUser, children, run

OS_USER = os.environ.get("PROFKIT_OS_USER", "profkit")
DB_USER = "profkit"

# Settings for benchmarking: no parallelism or JIT (they change the plan and
# the instrumentation pattern), no background noise (autovacuum), a throwaway
# cluster needs no durability.
BENCH_SETTINGS: dict[str, str] = {
    "max_parallel_workers_per_gather": "0",
    "jit": "off",
    "shared_buffers": "256MB",
    "shared_preload_libraries": "pg_stat_statements",
    "pg_stat_statements.track": "top",
    "pg_stat_statements.max": "1000",
    "autovacuum": "off",
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "max_connections": "30",
    "log_min_messages": "warning",
    "log_line_prefix": "%m [%p] ",
    "dynamic_shared_memory_type": "posix",
}


# initdb's arguments (the data directory aside); a cluster's own settings are appended
# to postgresql.conf afterwards.  The template a build keeps is named by their hash.
INITDB_ARGS = ("-U", DB_USER, "--auth=trust", "--no-sync", "-E", "UTF8", "--locale=C",
               "--no-instructions")
TEMPLATE_NAME = "cluster-template-" + hashlib.sha256("\0".join(INITDB_ARGS).encode()).hexdigest()[:10]


def ensure_os_user(name: str = OS_USER) -> OSUser:
    """The unprivileged account postgres runs as (only needed when we are root)."""
    if os.geteuid() != 0:
        pw = pwd.getpwuid(os.geteuid())
        return OSUser(pw.pw_name, pw.pw_uid, pw.pw_gid, pw.pw_dir)
    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        run(["useradd", "--system", "--user-group", "--no-create-home",
             "--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin", name],
            timeout=60, what="useradd")
        pw = pwd.getpwnam(name)
    return OSUser(pw.pw_name, pw.pw_uid, pw.pw_gid, "/tmp")


def port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def pick_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class ClusterInfo:
    """What a detached cluster (CLI `cluster start`) leaves on disk to be found again."""

    name: str
    build: str
    build_dir: str
    dir: str
    datadir: str
    socket_dir: str
    port: int
    pid: int
    os_user: str


class Cluster:
    def __init__(self, build: Build, *, name: str | None = None, port: int | None = None,
                 tcp: bool = False, settings: dict[str, str] | None = None,
                 base_dir: str | os.PathLike[str] | None = None, keep: bool = False,
                 start_timeout: float = 60.0, from_template: bool = True) -> None:
        if not build.postgres.exists():
            raise ClusterError(f"build {build.name} has no postgres binary at {build.postgres}; "
                               f"rebuild it with `profkit build {build.name}`")
        self.build = build
        self.name = name or build.name
        self.tcp = tcp
        self.requested_port = port
        self.settings = {**BENCH_SETTINGS, **(settings or {})}
        self.base_dir = Path(base_dir) if base_dir else paths.sub("clusters")
        self.keep = keep
        self.start_timeout = start_timeout
        self.from_template = from_template  # False: initdb for this cluster itself
        self.os_user = ensure_os_user()
        self.dir: Path | None = None
        self.port: int = 0
        self.proc: Background | None = None

    # -- paths --------------------------------------------------------------
    @property
    def datadir(self) -> Path:
        assert self.dir is not None
        return self.dir / "data"

    @property
    def socket_dir(self) -> Path:
        assert self.dir is not None
        return self.dir / "socket"

    @property
    def log_path(self) -> Path:
        assert self.dir is not None
        return self.dir / "postgres.log"

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise ClusterError("cluster not started")
        return self.proc.pid

    @property
    def dsn(self) -> str:
        return f"host={self.socket_dir} port={self.port} user={DB_USER} dbname=postgres"

    # -- lifecycle ----------------------------------------------------------
    def _chown(self, p: Path) -> None:
        if os.geteuid() == 0:
            os.chown(p, self.os_user.uid, self.os_user.gid)

    def start(self) -> Cluster:
        if self.requested_port is not None:
            if self.tcp and not port_free(self.requested_port):
                raise ClusterError(
                    f"port {self.requested_port} is already taken on 127.0.0.1; pick another "
                    "port (port=...) or omit it to let profkit choose a free one")
            self.port = self.requested_port
        else:
            self.port = pick_port()
        self.base_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.base_dir, 0o755)
        # a build name may hold '/' (pg19/vanilla) or '@' (vanilla@layout2): not in a path
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", self.name)
        self.dir = Path(tempfile.mkdtemp(prefix=f"{safe}-",
                                         dir=self.base_dir))
        os.chmod(self.dir, 0o755)
        self._chown(self.dir)
        self.socket_dir.mkdir(mode=0o700)
        os.chmod(self.socket_dir, 0o700)
        self._chown(self.socket_dir)
        try:
            self._initdb()
            self._launch()
        except BaseException:
            self.stop()
            raise
        return self

    def _initdb(self) -> None:
        template = self._template() if self.from_template else None
        if template is not None:
            # a copy of what initdb made for this build before, the configuration appended
            # below: start, connect and stop 0.21 s here in a folder whose subfolders are
            # spread (paths.spread_subfolders, the cache's clusters/), 0.94 s in a plain
            # one, against initdb's 1.33 s (medians, benchmarks/results/cluster_start.txt)
            run(["cp", "-a", template, self.datadir], user=self.os_user, timeout=300,
                what="copy of the build's initdb template")
        else:
            self._run_initdb(self.datadir, self.dir)
        conf = self.datadir / "postgresql.conf"
        with open(conf, "a") as f:
            f.write("\n# profkit benchmark settings\n")
            f.writelines(f"{k} = '{v}'\n" for k, v in self.settings.items())
            f.write(f"listen_addresses = '{'127.0.0.1' if self.tcp else ''}'\n")
            f.write(f"unix_socket_directories = '{self.socket_dir}'\n")
            f.write(f"port = {self.port}\n")

    def _run_initdb(self, datadir: Path, cwd: Path) -> None:
        run([self.build.bindir / "initdb", "-D", datadir, *INITDB_ARGS],
            user=self.os_user, cwd=cwd, timeout=300, what="initdb")

    def _template(self) -> Path | None:
        """The data directory initdb makes for this build (in the build's directory, so
        it goes with the build), made on first use.  Clusters copy it: it is what initdb
        would make again (same binary, same arguments; only pg_control's system
        identifier, which profkit never reads, is shared).  None where the build's
        directory cannot hold it (read-only): initdb then runs for every cluster."""
        final = self.build.dir / TEMPLATE_NAME
        if (final / "data" / "PG_VERSION").is_file():
            return final / "data"
        try:
            tmp = Path(tempfile.mkdtemp(prefix=".cluster-template-", dir=self.build.dir))
        except OSError:
            return None
        try:
            self._chown(tmp)
            self._run_initdb(tmp / "data", tmp)
            try:
                os.rename(tmp, final)  # atomic: a half-made template is never seen
            except OSError:
                if not (final / "data" / "PG_VERSION").is_file():
                    raise
            return final / "data"
        finally:
            shutil.rmtree(tmp, ignore_errors=True)  # ours, when another process won

    def _launch(self) -> None:
        # the build's own libpq for the modules that load one (postgres_fdw,
        # libpqwalreceiver): the install is relocated (DESTDIR), so its rpath names
        # a directory that does not exist and the system's older libpq would be found
        libdir = str(self.build.prefix / "lib")
        ld_path = ":".join(p for p in (libdir, os.environ.get("LD_LIBRARY_PATH", "")) if p)
        self.proc = Background([self.build.postgres, "-D", self.datadir], user=self.os_user,
                               env={"LD_LIBRARY_PATH": ld_path},
                               cwd=self.dir, stdout_path=self.log_path,
                               stderr_path=self.log_path, stop_signal=signal.SIGINT,
                               stop_timeout=60, what=f"postgres ({self.name})")
        self.proc.start()
        deadline = time.monotonic() + self.start_timeout
        while True:
            if not self.proc.alive():
                raise ClusterError(self._explain_start_failure())
            try:
                with psycopg.connect(self.dsn, connect_timeout=2):
                    return
            except psycopg.OperationalError:
                pass
            if time.monotonic() > deadline:
                raise ClusterError(f"postgres did not accept connections within "
                                   f"{self.start_timeout:.0f} s; log tail:\n{self._log_tail()}")
            time.sleep(0.1)

    def _log_tail(self, n: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"

    def _explain_start_failure(self) -> str:
        tail = self._log_tail()
        if "Address already in use" in tail or "could not bind" in tail:
            return (f"postgres could not start: port {self.port} is already in use; pass another "
                    f"port or omit it. Log:\n{tail}")
        if "could not create shared memory" in tail or "shmget" in tail:
            return f"postgres could not get shared memory: lower shared_buffers. Log:\n{tail}"
        return f"postgres exited during start-up. Log ({self.log_path}):\n{tail}"

    def crash_report(self) -> str:
        """The postmaster's log line about a backend's death ('' if none)."""
        if self.dir is None:
            return ""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        for line in reversed(text.splitlines()):
            if ("terminated by signal" in line or "was terminated by exception" in line
                    or "exited with exit code" in line):
                return line.split("LOG:", 1)[-1].strip()
        return ""

    def recovering(self) -> bool:
        """True while the postmaster restarts after a backend crash: the log's last
        crash line comes after its last "ready to accept connections" line."""
        if self.dir is None:
            return False
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return False
        for line in reversed(lines):
            if "ready to accept connections" in line:
                return False
            if ("terminated by signal" in line or "was terminated by exception" in line
                    or "exited with exit code" in line):
                return True
        return False

    def wait_ready(self, timeout: float = 20.0) -> bool:
        """Wait until the postmaster accepts connections (False if it died or timed out)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is None or not self.proc.alive():
                return False
            try:
                with psycopg.connect(self.dsn, connect_timeout=2):
                    return True
            except psycopg.OperationalError:
                time.sleep(0.1)
        return False

    def stop(self) -> None:
        """Fast shutdown by pid (escalating), then remove the directory unless kept.

        A fast-shutdown request that reaches PostgreSQL 18's postmaster while it
        reinitializes after a backend crash is logged but not acted on (seen here:
        ignored for 60 s, then SIGTERM too); once recovery is done it stops at
        once, so after a crash the stop waits for recovery first.
        """
        try:
            if self.proc is not None:
                # only a postmaster still recovering from a crash ignores the request;
                # one that is up again (or never crashed) stops at once
                if self.proc.alive() and self.recovering():
                    self.wait_ready()
                self.proc.stop(timeout=60)
        finally:
            if self.dir is not None and not self.keep:
                shutil.rmtree(self.dir, ignore_errors=True)

    def pause(self) -> None:
        """Stop the postmaster by pid (fast shutdown), keeping datadir, socket and port.

        For tools that need the data directory to themselves (callgrind runs a
        single-user backend on it); :meth:`resume` starts the postmaster again.
        Open connections die; reconnect after resume().
        """
        if self.proc is None or not self.proc.alive():
            raise ClusterError(f"cluster {self.name} is not running; start it first")
        self.proc.stop(timeout=60)

    def resume(self) -> None:
        """Start the postmaster again after :meth:`pause` (same datadir, socket, port)."""
        if self.proc is not None and self.proc.alive():
            return
        if self.dir is None:
            raise ClusterError(f"cluster {self.name} was never started")
        self._launch()

    def __enter__(self) -> Cluster:
        if self.proc is None:
            self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- use ----------------------------------------------------------------
    def connect(self, **kwargs) -> psycopg.Connection:
        kwargs.setdefault("autocommit", True)
        try:
            return psycopg.connect(self.dsn, **kwargs)
        except psycopg.OperationalError as e:
            alive = self.proc is not None and self.proc.alive()
            raise ClusterError(f"cannot connect to cluster {self.name} "
                               f"({'running' if alive else 'not running'}): {e}") from None

    @staticmethod
    def backend_pid(conn: psycopg.Connection) -> int:
        return int(conn.execute("SELECT pg_backend_pid()").fetchone()[0])

    def backend_pids(self) -> list[int]:
        """Pids of the postmaster's children (backends and auxiliary processes)."""
        return children(self.pid)

    def info(self) -> ClusterInfo:
        assert self.dir is not None
        return ClusterInfo(self.name, self.build.name, str(self.build.dir), str(self.dir),
                           str(self.datadir), str(self.socket_dir), self.port, self.pid,
                           self.os_user.name)

    def _repr_html_(self) -> str:
        state = "running" if self.proc is not None and self.proc.alive() else "stopped"
        pid = self.proc.pid if self.proc else "-"
        return (f"<b>Cluster {html.escape(self.name)}</b> ({state}, pid {pid}, "
                f"PostgreSQL {html.escape(self.build.version)}) socket "
                f"<code>{html.escape(str(self.socket_dir) if self.dir else '-')}</code> "
                f"port {self.port}")

    def __repr__(self) -> str:
        state = "running" if self.proc is not None and self.proc.alive() else "stopped"
        return f"<Cluster {self.name} {state} port={self.port} dir={self.dir}>"


# ---------------------------------------------------------------------------
# Detached clusters for the CLI (`profkit cluster start|stop|psql`)


def _state_file(name: str) -> Path:
    return paths.sub("clusters") / f"{name}.json"


def start_detached(build: Build, name: str | None = None, **kwargs) -> ClusterInfo:
    name = name or build.name
    sf = _state_file(name)
    if sf.exists():
        info = ClusterInfo(**json.loads(sf.read_text()))
        if _pid_is_postmaster(info.pid, info.datadir):
            raise ClusterError(f"cluster {name!r} is already running (pid {info.pid}); "
                               f"`profkit cluster stop {name}` first")
        sf.unlink()
    cl = Cluster(build, name=name, keep=True, **kwargs)
    cl.start()
    assert cl.proc is not None
    cl.proc.detach()
    info = cl.info()
    sf.write_text(json.dumps(info.__dict__, indent=1))
    return info


def detached_info(name: str) -> ClusterInfo:
    sf = _state_file(name)
    if not sf.exists():
        known = sorted(p.stem for p in paths.sub("clusters").glob("*.json"))
        raise ClusterError(f"no cluster named {name!r} was started with `profkit cluster start`; "
                           f"known: {', '.join(known) or 'none'}")
    return ClusterInfo(**json.loads(sf.read_text()))


def connect_detached(name: str) -> psycopg.Connection:
    """An autocommit connection to cluster *name* started with ``profkit cluster start``."""
    info = detached_info(name)
    try:
        return psycopg.connect(host=info.socket_dir, port=info.port, user=DB_USER,
                               dbname="postgres", autocommit=True)
    except psycopg.OperationalError as e:
        raise ClusterError(f"cannot connect to cluster {name!r}: {e}") from None


def redact_dsn(dsn: str) -> str:
    """*dsn* with its password replaced by ``***`` (for messages and provenance)."""
    return re.sub(r"(password\s*=\s*)\S+|(://[^:/@]+:)[^@]+@", lambda m: (
        (m.group(1) + "***") if m.group(1) else (m.group(2) + "***@")), dsn)


def connect_dsn(dsn: str) -> psycopg.Connection:
    """A connection to a server profkit did not start (autocommit, nothing changed)."""
    try:
        return psycopg.connect(dsn, autocommit=True, connect_timeout=10)
    except psycopg.Error as e:
        first = (str(e).strip().splitlines() or ["?"])[-1].strip()
        raise ClusterError(f"cannot connect to {redact_dsn(dsn)!r}: {first} (check host, "
                           "port, user and dbname; a socket directory is host=/path)") from None


def psql_command(name: str, args: tuple[str, ...] | list[str] = ()) -> tuple[list[str], dict[str, str]]:
    """argv and environment that run the build's own psql on detached cluster *name*."""
    info = detached_info(name)
    try:
        build = Build.from_dir(Path(info.build_dir))
    except (OSError, ValueError, TypeError) as e:
        raise ClusterError(f"cluster {name!r}: its build at {info.build_dir} is gone or "
                           f"unreadable ({e}); rebuild it with `profkit build {info.build}`") from None
    psql = build.bindir / "psql"
    if not psql.exists():
        raise ClusterError(f"cluster {name!r}: no psql in its build ({psql}); rebuild it with "
                           f"`profkit build {info.build}`")
    argv = [str(psql), "-h", info.socket_dir, "-p", str(info.port), "-U", DB_USER, "postgres",
            *args]
    return argv, build.client_env()


def _pid_is_postmaster(pid: int, datadir: str) -> bool:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return bool(cmd) and cmd[0].endswith(b"postgres") and datadir.encode() in cmd


def stop_detached(name: str, remove: bool = True, timeout: float = 60) -> None:
    info = detached_info(name)
    if _pid_is_postmaster(info.pid, info.datadir):
        for sig, t in ((signal.SIGINT, timeout), (signal.SIGQUIT, 5), (signal.SIGKILL, 5)):
            try:
                os.kill(info.pid, sig)
            except ProcessLookupError:
                break
            end = time.monotonic() + t
            while time.monotonic() < end and _pid_is_postmaster(info.pid, info.datadir):
                time.sleep(0.1)
            if not _pid_is_postmaster(info.pid, info.datadir):
                break
    if remove:
        shutil.rmtree(info.dir, ignore_errors=True)
    _state_file(name).unlink(missing_ok=True)
