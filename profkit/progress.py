"""One way to tell the user what is happening, wherever profkit runs.

- :func:`say`: one status line on stderr (``• msg``), for commands;
- :class:`Progress`: a bar for long work (builds, repetitions, probes) with phases. It
  draws itself with rich in a terminal, as one HTML display updated in place in a
  Jupyter kernel, as throttled lines on stderr elsewhere; or it hands every message to a
  callable (``progress=print``) or stays silent. Every experiment takes
  ``progress=`` as ``True`` (draw), a callable, a :class:`Progress`, or None, and turns
  it into a :class:`Progress` with :func:`as_progress`; ``Progress.say`` is itself a
  callable for libraries that take one (``get_build(..., progress=p.say)``).

Lines go to stderr, so a command's stdout stays its result.
"""
from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console


class _ErrConsole:
    """rich's Console on stderr, made on first use: importing rich costs a command line
    that only prints its --help or --version a tenth of a second."""

    _real: Console | None = None

    @property
    def console(self) -> Console:
        """The rich Console itself (for APIs that take one)."""
        if self._real is None:
            from rich.console import Console

            type(self)._real = Console(stderr=True)
        assert self._real is not None
        return self._real

    def __getattr__(self, name: str) -> Any:
        return getattr(self.console, name)


#: stderr's rich Console (``err_console.print``, ``.status``, ``.rule``), made on first use.
err_console: Any = _ErrConsole()

ProgressFn = Callable[[str], None]


def say(msg: str) -> None:
    """One status line on stderr (``• msg``)."""
    err_console.print(f"[cyan]•[/] {msg}", highlight=False)


def in_notebook() -> bool:
    """True inside a Jupyter kernel (not a plain IPython terminal)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    ip = get_ipython()
    return ip is not None and type(ip).__name__ == "ZMQInteractiveShell"


class Progress:
    """A progress display: ``with Progress(total, "work") as p: p.advance(message=...)``.

    *to*: ``True``/None — draw (rich in a terminal, HTML in a notebook, else lines on
    stderr); a callable — send it one line per message; ``False`` — nothing.
    :meth:`phase` starts a new bar (warm-up, benchmark, instruction counts...).
    """

    def __init__(self, total: int | None = None, description: str = "", *,
                 to: bool | ProgressFn | None = None, min_interval_s: float = 0.2) -> None:
        self.total = total
        self.description = description
        self.done = 0
        self.message = ""
        self.started = time.monotonic()
        self.min_interval_s = min_interval_s
        self._last = 0.0
        self._closed = False
        self._lock = threading.RLock()
        self._fn: ProgressFn | None = None
        self._rich: Any = None
        self._task: Any = None
        self._handle: Any = None
        if to is False:
            self.kind = "silent"
        elif callable(to):
            self.kind, self._fn = "fn", to
        elif in_notebook():
            from IPython.display import HTML, display

            self.kind = "html"
            self._handle = display(HTML(self._html()), display_id=True)
        elif sys.stderr.isatty():
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                SpinnerColumn,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )
            from rich.progress import Progress as RichProgress

            self.kind = "rich"
            self._rich = RichProgress(SpinnerColumn(), TextColumn("{task.description}"),
                                      BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                      TimeRemainingColumn(), console=err_console.console,
                                      transient=False)
            self._rich.start()
            if total is not None or description:
                self._task = self._rich.add_task(description, total=total)
        else:
            self.kind = "lines"

    # -- updates -----------------------------------------------------------
    def phase(self, description: str, total: int | None) -> None:
        """A new stage of the work with its own count."""
        with self._lock:
            if self.kind == "fn":
                assert self._fn is not None
                self._fn(f"{description} ({total})")
                return
            self.description, self.total, self.done, self.message = description, total, 0, ""
            if self._rich is not None:
                if self._task is not None:
                    self._rich.update(self._task, visible=False)
                self._task = self._rich.add_task(description, total=total)
                return
            self._refresh(force=True)

    def advance(self, n: int | str = 1, message: str | None = None) -> None:
        """*n* more units done (``advance("text")``: one unit, with a message)."""
        if isinstance(n, str):
            n, message = 1, n
        with self._lock:
            self.done += n
            if message is not None:
                self.message = message
            if self.kind == "fn":
                if message:
                    assert self._fn is not None
                    self._fn(message)
            elif self._rich is not None:
                if self._task is None:
                    self._task = self._rich.add_task(self.description, total=self.total)
                kw = {"description": message} if message else {}
                self._rich.update(self._task, advance=n, **kw)
            else:
                self._refresh()

    def say(self, message: str) -> None:
        """A ``progress=`` callback: show *message* without advancing."""
        with self._lock:
            self.message = message
            if self.kind == "fn":
                assert self._fn is not None
                self._fn(message)
            elif self._rich is not None:
                self._rich.console.log(message)
            else:
                self._refresh(force=True)

    __call__ = say

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._rich is not None:
                self._rich.stop()
            elif self.kind in ("html", "lines"):
                self._refresh(force=True)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is not None:
            self.message = f"stopped: {exc[1]}"
        self.close()

    # -- rendering -----------------------------------------------------------
    @property
    def fraction(self) -> float | None:
        if not self.total:
            return None
        return min(1.0, self.done / self.total)

    def text(self) -> str:
        elapsed = time.monotonic() - self.started
        count = f"{self.done}/{self.total}" if self.total else f"{self.done}"
        msg = f" — {self.message}" if self.message else ""
        return f"{self.description} [{count}] {elapsed:.1f} s{msg}"

    def _html(self) -> str:
        frac = self.fraction
        pct = 0.0 if frac is None else frac * 100
        bar = (f"<div style='display:inline-block;width:240px;height:12px;background:#ddd;"
               f"vertical-align:middle;margin-right:8px'><div style='width:{pct:.1f}%;"
               f"height:12px;background:#4C72B0'></div></div>") if frac is not None else ""
        import html

        return f"<div style='font-family:monospace'>{bar}{html.escape(self.text())}</div>"

    def _refresh(self, force: bool = False) -> None:
        if self.kind not in ("html", "lines"):
            return
        now = time.monotonic()
        if not force and now - self._last < self.min_interval_s and (
                self.total is None or self.done < self.total):
            return
        self._last = now
        if self._handle is not None:
            from IPython.display import HTML

            self._handle.update(HTML(self._html()))
        else:
            print(self.text(), file=sys.stderr, flush=True)


def as_progress(progress: bool | ProgressFn | Progress | None) -> Progress:
    """What an experiment's ``progress=`` argument means, as a :class:`Progress`."""
    if isinstance(progress, Progress):
        return progress
    if progress is None or progress is False:
        return Progress(to=False)
    return Progress(to=progress)
