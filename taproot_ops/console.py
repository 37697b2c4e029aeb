"""What a command says while it works: its lines, a live line during every
wait, the noise of the tools it runs kept in a log file, and the terminal's
Ctrl-C kept to itself.

Standard library only: the Makefile runs this file with the system's Python
before `.venv` exists (`python3 taproot_ops/console.py --log FILE --what TEXT
-- COMMAND...`: run COMMAND with its output in FILE and a live line showing
how long it has taken and the last thing it logged).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Callable, Iterator

_lock = threading.RLock()
_live: "Waiting | None" = None
SPINNER = "|/-\\"
TTY_TICK_S = 0.25
# Without a terminal (a log, CI), a line every so often instead of a live one.
PLAIN_TICK_S = 15.0


def say(text: str = "", stream: IO[str] | None = None) -> None:
    """Print a line (flushed), above the live line if one is shown."""
    out = stream or sys.stdout
    with _lock:
        try:
            if _live is not None and _live.live:
                _live.clear()
            print(text, file=out, flush=True)
            if _live is not None and _live.live:
                _live.draw()
        except (BrokenPipeError, OSError, ValueError):
            pass  # the terminal or pipe went away (Ctrl-C on `make run | tee`): keep shutting down


def _seconds(value: float) -> str:
    return f"{value:.0f} s" if value < 120 else f"{value // 60:.0f} min {value % 60:02.0f} s"


class Waiting:
    """A wait the user sees: on a terminal, one line redrawn four times a
    second (spinner, what, seconds so far, the usual time, a detail the work
    updates); elsewhere, a line at the start and one every 15 s. On leaving,
    one line with the time it took (or that it failed)."""

    def __init__(self, what: str, usually_s: float | None = None, stream: IO[str] | None = None,
                 detail: Callable[[], str] | None = None, indent: str = "   ", detail_at_end: bool = True):
        self.what = what
        self.detail_at_end = detail_at_end
        self.usually_s = usually_s
        self.stream = stream or sys.stdout
        self.detail_of = detail
        self.indent = indent
        self.detail = ""
        self.failed = False   # set by the work when it failed without raising
        self.started = 0.0
        self.live = _is_terminal(self.stream)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._width = 0

    def __enter__(self) -> "Waiting":
        global _live
        self.started = time.monotonic()
        with _lock:
            _live = self
            if self.live:
                self.draw()
            else:
                self._print(f"{self.indent}{self.what}{self._usually()}...")
        self._thread = threading.Thread(target=self._tick, name="console-waiting", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> None:
        global _live
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        took = _seconds(time.monotonic() - self.started)
        with _lock:
            if self.live:
                self.clear()
            _live = None
            if exc is None and not self.failed:
                self._print(f"{self.indent}{self.what}: done in {took}"
                            + (self._detail(", ") if self.detail_at_end else ""))
            elif isinstance(exc, KeyboardInterrupt):
                self._print(f"{self.indent}{self.what}: interrupted after {took}")
            else:
                self._print(f"{self.indent}{self.what}: failed after {took}")

    def note(self, detail: str) -> None:
        """What the work is at now (shown on the live line)."""
        self.detail = detail

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def _usually(self) -> str:
        return f" (usually about {_seconds(self.usually_s)})" if self.usually_s else ""

    def _detail(self, prefix: str) -> str:
        if self.detail_of is not None:
            try:
                self.detail = self.detail_of()
            except Exception:   # a detail is a nicety: never let it end the wait
                pass
        return f"{prefix}{self.detail}" if self.detail else ""

    def _tick(self) -> None:
        last_plain = time.monotonic()
        i = 0
        while not self._stop.wait(TTY_TICK_S if self.live else 1.0):
            i += 1
            with _lock:
                if self.live:
                    self.draw(i)
                elif time.monotonic() - last_plain >= PLAIN_TICK_S:
                    last_plain = time.monotonic()
                    self._print(f"{self.indent}  ... {_seconds(self.elapsed())}{self._detail(': ')}")

    def draw(self, i: int = 0) -> None:
        usually = f" of about {_seconds(self.usually_s)}" if self.usually_s else ""
        line = (f"{self.indent}{SPINNER[i % len(SPINNER)]} {self.what}: {_seconds(self.elapsed())}{usually}"
                f"{self._detail('  ')}")
        columns = _columns(self.stream)
        if len(line) > columns - 1:
            line = line[: columns - 2] + "~"
        self._write("\r" + line + " " * max(0, self._width - len(line)))
        self._width = len(line)

    def clear(self) -> None:
        self._write("\r" + " " * self._width + "\r")
        self._width = 0

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (BrokenPipeError, OSError, ValueError):
            pass

    def _print(self, text: str) -> None:
        self._write(text + "\n")


def _is_terminal(stream: IO[str]) -> bool:
    try:
        return stream.isatty() and os.environ.get("TERM") != "dumb"
    except (ValueError, AttributeError):
        return False


def _columns(stream: IO[str]) -> int:
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (OSError, ValueError, AttributeError):
        return 100


@contextlib.contextmanager
def output_to(log_file: Path, show_on: int = 1) -> Iterator[IO[str]]:
    """Send this process's file descriptors 1 and 2 (its own prints, and
    what child processes started in the block, such as a JVM, write for
    good) to `log_file` for the block; yield a stream on where descriptor
    `show_on` went before, for what the user should see."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    terminal = os.fdopen(os.dup(saved[0] if show_on == 1 else saved[1]), "w", buffering=1)
    log_fd = os.open(log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        yield terminal
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (log_fd, *saved):
            os.close(fd)
        terminal.close()


class Terminal:
    """Make this process's group the terminal's foreground group, so that
    Ctrl-C reaches this process (and the children of its group) and not its
    parent: under `make run`, make then sees its recipe end as it chose to
    (exit 0 after a clean stop) instead of dying of SIGINT itself
    ("make: *** Interrupt", exit 130). `restore()` gives the terminal back.
    A no-op without a controlling terminal, or when not in the foreground."""

    def __init__(self) -> None:
        self._fd: int | None = None
        self._previous: int | None = None

    def take(self) -> bool:
        try:
            fd = os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY)
        except OSError:
            return False
        try:
            previous = os.tcgetpgrp(fd)
            if previous != os.getpgrp():
                os.close(fd)
                return False   # started in the background (`&`): leave the terminal alone
            if os.getpgrp() != os.getpid():
                os.setpgid(0, 0)
                # A process outside the foreground group may set it only with SIGTTOU ignored.
                old = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
                try:
                    os.tcsetpgrp(fd, os.getpgrp())
                finally:
                    signal.signal(signal.SIGTTOU, old)
                # Ctrl-Z would stop this group alone, out of the parent shell's job control (it
                # waits on make, which still runs): the terminal would hang. It does nothing instead.
                signal.signal(signal.SIGTSTP, signal.SIG_IGN)
        except OSError:
            os.close(fd)
            return False
        self._fd, self._previous = fd, previous
        return True

    def restore(self) -> None:
        if self._fd is None:
            return
        old = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
        try:
            if self._previous is not None and self._previous != os.getpgrp():
                os.tcsetpgrp(self._fd, self._previous)
        except OSError:
            pass   # the parent's group is gone: its shell takes the terminal back itself
        finally:
            signal.signal(signal.SIGTTOU, old)
            os.close(self._fd)
            self._fd = None


def _last_line(log_file: Path, since: int) -> str:
    """The last non-empty line written to `log_file` after offset `since`."""
    try:
        with open(log_file, "rb") as fh:
            fh.seek(max(since, os.path.getsize(log_file) - 4096))
            lines = [x.strip() for x in fh.read().decode(errors="replace").splitlines()
                     if x.strip() and not x.startswith("=== ")]   # not run_logged's own header
    except OSError:
        return ""
    return lines[-1] if lines else ""


def run_logged(command: list[str], what: str, log_file: Path, usually_s: float | None = None) -> int:
    """Run `command` with its output appended to `log_file`, showing a live
    line; on failure, print the end of its output and where the rest is."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    since = log_file.stat().st_size if log_file.exists() else 0
    with open(log_file, "ab") as log:
        log.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} {what}: {' '.join(command)}\n".encode())
        log.flush()
        with Waiting(what, usually_s, indent="", detail=lambda: _last_line(log_file, since)[:100],
                     detail_at_end=False) as waiting:
            code = subprocess.call(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            waiting.failed = code != 0
    if code != 0:
        with open(log_file, "rb") as fh:
            fh.seek(since)
            tail = fh.read().decode(errors="replace").splitlines()[-25:]
        say("\n".join(tail), sys.stderr)
        say(f"error: {what} failed (exit {code}); its whole output is in {log_file}", sys.stderr)
    return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="run a command with its output in a log and a live line")
    parser.add_argument("--log", required=True, type=Path, help="the log file (appended to)")
    parser.add_argument("--what", required=True, help="what the user is told the step does")
    parser.add_argument("--usually", type=float, help="how long it usually takes, in seconds")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given (after --)")
    try:
        return run_logged(command, args.what, args.log, args.usually)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
