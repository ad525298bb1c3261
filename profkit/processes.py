"""The one place profkit runs external programs.

Why plain :mod:`subprocess` and not the ``sh`` package the design notes name:
profkit must (a) know the pid of every process it starts so it can stop it by
pid, (b) start servers and tracers in their own process group and signal the
group, (c) drop privileges to an unprivileged OS user for initdb/postgres
(``Popen(user=..., group=...)``, which makes the child *be* the server rather
than a ``runuser`` parent), and (d) stop tracers with SIGINT and escalate.
``sh`` hides the Popen object behind its own process wrapper and runs a
background thread per command; for these four needs subprocess is the more
direct tool, so every call goes through :func:`run` and :class:`Background`.

Every command line is logged (logger ``profkit.processes``); a missing program turns
into :class:`ToolNotFound` saying which package installs it.
"""
from __future__ import annotations

import atexit
import logging
import os
import shlex
import shutil
import signal
import stat
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from profkit import paths
from profkit.errors import CommandFailed, ToolNotFound

log = logging.getLogger("profkit.processes")

# tool -> (Debian package, Ubuntu package)
INSTALL_HINTS: dict[str, tuple[str, str]] = {
    "perf": ("linux-perf", "linux-tools-$(uname -r) linux-tools-common"),
    "ltrace": ("ltrace", "ltrace"),
    "bpftrace": ("bpftrace", "bpftrace"),
    "valgrind": ("valgrind", "valgrind"),
    "gprof": ("binutils", "binutils"),
    "ccache": ("ccache", "ccache"),
    "gcc": ("build-essential", "build-essential"),
    "make": ("build-essential", "build-essential"),
    "patch": ("patch", "patch"),
    "bison": ("bison", "bison"),
    "flex": ("flex", "flex"),
    "apt-get": ("apt", "apt"),
    "dpkg-source": ("dpkg-dev", "dpkg-dev"),
    "chromium": ("chromium", "chromium-browser"),
    "py-spy": ("(pip) profkit[pyspy]", "(pip) profkit[pyspy]"),
    "git": ("git", "git"),
    "tar": ("tar", "tar"),
}


def install_hint(tool: str) -> str:
    deb, ubu = INSTALL_HINTS.get(tool, (tool, tool))
    if deb.startswith("(pip)"):
        return (f"install it with: pip install '{deb.split()[-1]}' (or run `make venv` in the "
                f"clone)")
    return (f"install it with: apt-get install {deb} (Debian) / apt-get install {ubu} (Ubuntu), "
            f"or run scripts/setup-system.sh")


def which(tool: str, extra_paths: Sequence[str | os.PathLike[str]] = ()) -> str:
    """Absolute path of *tool*, or :class:`ToolNotFound` with an install hint."""
    if os.sep in tool:
        if os.access(tool, os.X_OK):
            return tool
        raise ToolNotFound(f"{tool} not found or not executable")
    for d in extra_paths:
        cand = Path(d) / tool
        if os.access(cand, os.X_OK):
            return str(cand)
    found = shutil.which(tool)
    if found is None:
        raise ToolNotFound(f"'{tool}' is not installed; {install_hint(tool)}")
    return found


@dataclass(frozen=True)
class OSUser:
    """An OS account to run a child as (postgres refuses to run as root)."""

    name: str
    uid: int
    gid: int
    home: str


# Variables GNU make exports to its recipes.  When profkit itself runs under
# make (`make demo`, `make test`, `make regress`) they would reach PostgreSQL's
# own make, whose src/Makefile.global builds the generated headers and make
# check's temporary install only at MAKELEVEL 0: a cold build then fails.
# No child profkit starts wants them, so they are dropped for every child.
MAKE_VARIABLES = ("MAKELEVEL", "MAKEFLAGS", "MFLAGS", "MAKEOVERRIDES", "GNUMAKEFLAGS", "MAKE_TERMOUT",
                  "MAKE_TERMERR")


def child_env(extra: Mapping[str, str] | None = None, user: OSUser | None = None) -> dict[str, str]:
    """The environment of a child: ours without make's variables, plus *extra*.

    Jobserver descriptors travel inside MAKEFLAGS (``--jobserver-auth=R,W`` or
    ``fifo:PATH``); dropping MAKEFLAGS drops them, and the inherited pipe fds
    are closed anyway (``close_fds``).
    """
    env = {k: v for k, v in os.environ.items() if k not in MAKE_VARIABLES}
    if extra:
        env.update(extra)
    if user is not None and os.geteuid() == 0:
        env.update(HOME=user.home, USER=user.name, LOGNAME=user.name)
        # a TMPDIR of root's own (pam_tmpdir's /tmp/user/0, mode 0700) is no place for
        # the user's files: valgrind, as the clusters' user, could not start there. The
        # child gets the system's default instead, unless the folder is the user's own
        # or shared as /tmp is (writable by all, sticky)
        if "TMPDIR" in env and not _temp_dir_for(env["TMPDIR"], user.uid):
            del env["TMPDIR"]
    return env


def _temp_dir_for(path: str, uid: int) -> bool:
    """Whether user *uid* may make files in folder *path* as in a temp folder (and reach
    it: every folder above it open to all)."""
    try:
        st = os.stat(path)
    except OSError:
        return False
    if not stat.S_ISDIR(st.st_mode) or not paths.reachable_by_all(Path(path).resolve().parent):
        return False
    if st.st_uid == uid:
        return bool(st.st_mode & stat.S_IWUSR)
    shared = stat.S_IWOTH | stat.S_IXOTH | stat.S_ISVTX
    return st.st_mode & shared == shared


def _tail(text: str, lines: int = 30) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


def format_argv(argv: Sequence[str]) -> str:
    return shlex.join(str(a) for a in argv)


def run(
    argv: Sequence[str | os.PathLike[str]],
    *,
    timeout: float | None = 600,
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    user: OSUser | None = None,
    check: bool = True,
    input: str | bytes | None = None,
    stdout_path: str | os.PathLike[str] | None = None,
    merge_stderr: bool = False,
    text: bool = True,
    what: str | None = None,
) -> subprocess.CompletedProcess:
    """Run *argv* to completion.

    ``stdout_path`` appends stdout (and stderr when ``merge_stderr``) to a log
    file instead of capturing it, for long outputs like build logs.  On a
    non-zero exit with ``check`` a :class:`CommandFailed` carries the output's
    tail.  A missing program raises :class:`ToolNotFound`.
    """
    argv = [str(a) for a in argv]
    what = what or Path(argv[0]).name
    log.info("run: %s%s", format_argv(argv), f" (cwd={cwd})" if cwd else "")
    full_env = child_env(env, user)
    kwargs: dict = {}
    if user is not None and os.geteuid() == 0:
        kwargs.update(user=user.uid, group=user.gid, extra_groups=[])
    out_f = None
    try:
        if stdout_path is not None:
            out_f = open(stdout_path, "ab")
            stdout = out_f
            stderr = subprocess.STDOUT if merge_stderr else subprocess.PIPE
        else:
            stdout = subprocess.PIPE
            stderr = subprocess.STDOUT if merge_stderr else subprocess.PIPE
        try:
            cp = _run_group(argv, cwd=cwd, env=full_env, stdout=stdout, stderr=stderr,
                            input=input.encode() if isinstance(input, str) else input,
                            timeout=timeout, **kwargs)
        except FileNotFoundError as e:
            if e.filename in (argv[0], None) or not cwd or Path(cwd).exists():
                raise ToolNotFound(
                    f"'{argv[0]}' is not installed; {install_hint(Path(argv[0]).name)}") from None
            raise
        except subprocess.TimeoutExpired as e:
            raise CommandFailed(
                f"{what} timed out after {timeout} s: {format_argv(argv)}", argv, None,
                _tail(_decode(e.stdout) + _decode(e.stderr))) from None
    finally:
        if out_f is not None:
            out_f.close()
    out = _decode(cp.stdout) if text else cp.stdout
    err = _decode(cp.stderr) if text else cp.stderr
    res = subprocess.CompletedProcess(argv, cp.returncode, out, err)
    if check and cp.returncode != 0:
        if stdout_path is not None:
            tail = _tail(Path(stdout_path).read_text(errors="replace"))
        else:
            tail = _tail((out or "") + "\n" + (err or "")) if text else ""
        raise CommandFailed(
            f"{what} failed with exit code {cp.returncode}: {format_argv(argv)}\n{tail}",
            argv, cp.returncode, tail)
    return res


def _run_group(argv: list[str], *, timeout: float | None, input: bytes | None,
               **popen_kwargs) -> subprocess.CompletedProcess:
    """subprocess.run, but the child leads a process group of its own, and on a
    timeout, an error or Ctrl-C the whole group is killed: a `make -j2` interrupted
    half-way leaves no compiler behind (subprocess.run would kill make alone)."""
    # SIGTERM must unwind through the except below too (a build started by a script that
    # is then terminated left `make -j2` compiling in its own session)
    _install_handlers()
    with subprocess.Popen(argv, stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
                          start_new_session=True, **popen_kwargs) as proc:
        with _running_lock:
            _running[proc.pid] = threading.get_ident()
        try:
            out, err = proc.communicate(input, timeout=timeout)
        except BaseException:
            _kill_group_quietly(proc.pid)
            proc.wait()
            raise
        finally:
            with _running_lock:
                _running.pop(proc.pid, None)
        return subprocess.CompletedProcess(argv, proc.returncode, out, err)


# The commands run() is waiting for, each a process group, by the thread that waits: an
# interrupted main thread stops those of its helper threads (get_builds), which a Ctrl-C
# or SIGTERM does not reach (their groups are their own, and Python raises in the main
# thread only).
_running: dict[int, int] = {}
_running_lock = threading.Lock()


def stop_commands_of(threads: set[int]) -> None:
    """Kill the process groups that run() started from *threads* (thread idents) and
    still waits for; each such run() then fails as for a command that was killed."""
    with _running_lock:
        groups = [pgid for pgid, t in _running.items() if t in threads]
    for pgid in groups:
        _kill_group_quietly(pgid)


def _decode(b: bytes | str | None) -> str:
    if b is None:
        return ""
    if isinstance(b, str):
        return b
    return b.decode(errors="replace")


# ---------------------------------------------------------------------------
# Background processes, stopped by pid, also on errors, Ctrl-C and exit.

_live: dict[int, Background] = {}
_live_lock = threading.Lock()


class Background:
    """A long-running child (postgres, perf record, ltrace, a probe).

    Started in its own session/process group, registered so it is stopped by
    pid at interpreter exit and on SIGTERM; :meth:`stop` sends ``stop_signal``
    (SIGINT for perf so perf.data is finalised), waits, then escalates to
    SIGTERM and SIGKILL on the whole process group.
    """

    def __init__(
        self,
        argv: Sequence[str | os.PathLike[str]],
        *,
        cwd: str | os.PathLike[str] | None = None,
        env: Mapping[str, str] | None = None,
        user: OSUser | None = None,
        stdout_path: str | os.PathLike[str] | None = None,
        stderr_path: str | os.PathLike[str] | None = None,
        stop_signal: int = signal.SIGINT,
        stop_timeout: float = 30.0,
        what: str | None = None,
        stdin_pipe: bool = False,
    ) -> None:
        self.stdin_pipe = stdin_pipe  # True: feed it with write_stdin() / close_stdin()
        self.argv = [str(a) for a in argv]
        self.cwd = cwd
        self.env = env
        self.user = user
        self.stdout_path = stdout_path
        self.stderr_path = stderr_path
        self.stop_signal = stop_signal
        self.stop_timeout = stop_timeout
        self.what = what or Path(self.argv[0]).name
        self.proc: subprocess.Popen | None = None
        self._files: list = []

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise RuntimeError(f"{self.what} not started")
        return self.proc.pid

    def start(self) -> Background:
        full_env = child_env(self.env, self.user)
        kwargs: dict = {}
        if self.user is not None and os.geteuid() == 0:
            kwargs.update(user=self.user.uid, group=self.user.gid, extra_groups=[])
        out = open(self.stdout_path, "ab") if self.stdout_path else subprocess.DEVNULL
        if self.stderr_path and self.stderr_path == self.stdout_path:
            err = subprocess.STDOUT
        else:
            err = open(self.stderr_path, "ab") if self.stderr_path else subprocess.DEVNULL
        self._files = [f for f in (out, err) if hasattr(f, "close")]
        log.info("start: %s", format_argv(self.argv))
        try:
            self.proc = subprocess.Popen(
                self.argv, cwd=self.cwd, env=full_env,
                stdin=subprocess.PIPE if self.stdin_pipe else subprocess.DEVNULL,
                stdout=out, stderr=err, start_new_session=True, **kwargs)
        except FileNotFoundError:
            self._close_files()
            raise ToolNotFound(
                f"'{self.argv[0]}' is not installed; {install_hint(Path(self.argv[0]).name)}"
            ) from None
        with _live_lock:
            _live[self.proc.pid] = self
        _install_handlers()
        return self

    def poll(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait(self, timeout: float | None = None) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)

    def write_stdin(self, data: bytes) -> None:
        """Write *data* to the child's stdin (``stdin_pipe=True``); a child that has
        exited already is not an error here (its exit status says what happened)."""
        assert self.proc is not None and self.proc.stdin is not None
        try:
            self.proc.stdin.write(data)
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass

    def close_stdin(self) -> None:
        """End the child's input (``stdin_pipe=True``)."""
        if self.proc is not None and self.proc.stdin is not None and not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()
            except BrokenPipeError:
                pass

    def signal(self, sig: int) -> None:
        if self.alive():
            os.kill(self.pid, sig)

    def stop(self, timeout: float | None = None) -> int | None:
        """Stop by pid: stop_signal, then SIGTERM, then SIGKILL to the group."""
        if self.proc is None:
            return None
        timeout = self.stop_timeout if timeout is None else timeout
        try:
            if self.proc.poll() is None:
                for sig, t in ((self.stop_signal, timeout), (signal.SIGTERM, 5.0),
                               (signal.SIGKILL, 5.0)):
                    if sig != signal.SIGKILL and _ignores(self.proc.pid, sig):
                        # inherited: a child of a background job or of a CI runner
                        # ignores SIGINT; waiting for it to act on one is a lost timeout
                        log.info("%s (pid %d) ignores signal %d: the next one", self.what,
                                 self.pid, sig)
                        continue
                    try:
                        if sig == signal.SIGKILL:
                            os.killpg(self.proc.pid, sig)
                        else:
                            os.kill(self.proc.pid, sig)
                    except ProcessLookupError:
                        break
                    try:
                        self.proc.wait(t)
                        break
                    except subprocess.TimeoutExpired:
                        log.warning("%s (pid %d) ignored signal %d", self.what, self.pid, sig)
            # children left in the group (e.g. a tracer's helpers) go too
            try:
                os.killpg(self.proc.pid, 0)
            except (ProcessLookupError, PermissionError):
                pass
            else:
                _kill_group_quietly(self.proc.pid)
            return self.proc.returncode
        finally:
            self.close_stdin()
            self._close_files()
            with _live_lock:
                _live.pop(self.proc.pid, None)

    def detach(self) -> None:
        """Leave the process running after this interpreter exits (CLI `cluster start`).

        The caller records the pid so a later command can stop it.
        """
        if self.proc is not None:
            with _live_lock:
                _live.pop(self.proc.pid, None)
        self._close_files()

    def _close_files(self) -> None:
        for f in self._files:
            try:
                f.close()
            except OSError:
                pass
        self._files = []

    def __enter__(self) -> Background:
        if self.proc is None:
            self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _ignores(pid: int, sig: int) -> bool:
    """True when *pid* ignores *sig* (SigIgn in /proc/PID/status)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("SigIgn:"):
                    return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


def _kill_group_quietly(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGTERM)
        time.sleep(0.2)
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def stop_all() -> None:
    """Stop every live background process (atexit and signal handlers call this)."""
    with _live_lock:
        procs = list(_live.values())
    for p in reversed(procs):
        try:
            p.stop(timeout=10)
        except Exception:
            log.exception("could not stop %s", p.what)


_handlers_installed = False
_atexit_registered = False


def _install_handlers() -> None:
    """stop_all at exit, and on SIGTERM (whose handler only the main thread may set: a
    first call from another thread leaves that to the main thread's next call)."""
    global _handlers_installed, _atexit_registered
    if _handlers_installed:
        return
    if not _atexit_registered:
        _atexit_registered = True
        atexit.register(stop_all)
    if threading.current_thread() is not threading.main_thread():
        return
    _handlers_installed = True
    prev = signal.getsignal(signal.SIGTERM)

    def on_term(signum, frame):
        stop_all()
        if callable(prev):
            prev(signum, frame)
        raise SystemExit(128 + signum)

    try:
        signal.signal(signal.SIGTERM, on_term)
    except ValueError:
        pass


def install_handlers() -> None:
    """What run() and Background install on first use: stop_all at exit and on SIGTERM.
    Code that runs commands from helper threads calls it from the main thread first
    (only that thread may set a signal handler)."""
    _install_handlers()


def live_pids() -> list[int]:
    with _live_lock:
        return list(_live)


def children(pid: int) -> list[int]:
    """Pids of the processes whose parent is *pid* (from /proc)."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(d.name))
    return out
