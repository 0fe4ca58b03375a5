"""A service optlab starts itself: render the command, start it, wait for health, watch, stop.

The service runs in its own process group (a Ctrl-C in the terminal reaches optlab, which then
stops the service in order: SIGTERM to the whole group, SIGKILL after the grace period) and,
on Linux, is killed by the kernel should optlab itself die without cleaning up
(PR_SET_PDEATHSIG). Its output is read continuously; the tail is kept with the run.
"""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psutil

from optlab.config.models import CommandTarget, OpenAITarget
from optlab.errors import ConfigError, TargetError
from optlab.targets.templates import Secrets

__all__ = ["Service", "parent_death_signal", "port_of"]

POLL_S = 0.1
HEALTH_TIMEOUT_S = 2.0
LOG_LINE_CHARS = 2_000
MAX_PROCESSES = 64  # distinct command lines kept of a service's process tree


def port_of(url: str, field: str) -> tuple[str, int]:
    parts = urlsplit(url)
    if not parts.hostname:
        raise ConfigError(f"{field}: {url!r} names no host", hint="write http://HOST:PORT/path")
    try:
        port = parts.port
    except ValueError:
        raise ConfigError(
            f"{field}: the port in {url!r} is not a number", hint="HOST:PORT"
        ) from None
    return parts.hostname, port or (443 if parts.scheme == "https" else 80)


def _listening(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def parent_death_signal() -> Callable[[], None] | None:
    """Linux: a function that makes the kernel SIGKILL the calling process when its parent
    dies, even by SIGKILL (PR_SET_PDEATHSIG). A service arms it between fork and exec, so the
    C function is looked up here, in the parent: loading a library in a forked child of a
    threaded process can hang.
    """
    if sys.platform != "linux":
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None

    def arm() -> None:  # pragma: no cover - runs in the child
        prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG

    return arm


# PR_SET_PDEATHSIG reaches only the service's own process: behind a wrapper
# (`sh -c "python svc.py"`) the server outlives a SIGKILLed optlab and holds its port. The
# reaper, a bare interpreter in a session of its own, reads a pipe only optlab holds: at EOF
# (optlab gone, however it died) it kills the service's whole process group; a byte means
# the service was stopped already, and it leaves quietly.
_REAPER = (
    "import os, signal, sys\n"
    "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
    "if not sys.stdin.buffer.read(1):\n"
    "    try:\n"
    "        os.killpg(int(sys.argv[1]), signal.SIGKILL)\n"
    "    except OSError:\n"
    "        pass\n"
)


def _start_reaper(pgid: int) -> subprocess.Popen[bytes] | None:
    try:
        return subprocess.Popen(
            [sys.executable, "-S", "-c", _REAPER, str(pgid)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
    except OSError:  # the service still has PR_SET_PDEATHSIG
        return None


def _release_reaper(reaper: subprocess.Popen[bytes] | None) -> None:
    if reaper is None or reaper.stdin is None:
        return
    with contextlib.suppress(OSError):
        reaper.stdin.write(b"x")
        reaper.stdin.close()
    with contextlib.suppress(subprocess.TimeoutExpired):
        reaper.wait(2.0)


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


class Service:
    """One service process tree, from start to stop."""

    def __init__(
        self,
        target: CommandTarget | OpenAITarget,
        knobs: dict[str, Any],
        secrets: Secrets,
        folder: Path,
    ) -> None:
        assert target.command, "a service needs a command"
        self.target = target
        self.secrets = secrets
        fill = secrets.fill
        self.argv = [
            fill(arg, knobs, f"target.command[{i}]") for i, arg in enumerate(target.command)
        ]
        self.env = {
            name: fill(value, knobs, f"target.env.{name}") for name, value in target.env.items()
        }
        self.host, self.port = port_of(fill(target.url, knobs, "target.url"), "target.url")
        self.health_url = (
            fill(target.health_url, knobs, "target.health_url") if target.health_url else None
        )
        cwd = Path(target.cwd) if target.cwd else folder
        self.cwd = cwd if cwd.is_absolute() else folder / cwd
        self.process: subprocess.Popen[bytes] | None = None
        self._reaper: subprocess.Popen[bytes] | None = None
        self._lines: collections.deque[str] = collections.deque(
            maxlen=max(target.log_tail_lines, 1)
        )
        self._reader: threading.Thread | None = None
        self._stopping = False
        self.started_at = 0.0
        self.ready_s: float | None = None
        self.stopped_with: str | None = None
        # Distinct command lines seen in the service's process tree (workers a framework
        # forks, the interpreter a wrapper script execs): cmdline -> {cmdline, exe, count}.
        self._processes: dict[tuple[str, ...], dict[str, Any]] = {}

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the service and wait until it is healthy; on any failure it is stopped."""
        if _listening(self.host, self.port):
            raise TargetError(
                f"port {self.port} on {self.host} is already in use: something answers there "
                "before optlab started the service",
                hint=f"stop what listens there (`ss -ltnp 'sport = :{self.port}'` names it) or "
                "change the port in target.url and the command",
            )
        if not self.cwd.is_dir():
            raise ConfigError(f"target.cwd: {self.cwd} is not a folder", hint="fix target.cwd")
        try:
            self.process = subprocess.Popen(
                self.argv,
                cwd=self.cwd,
                env={**os.environ, **self.env},
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own group: stopped as a whole, spared our Ctrl-C
                preexec_fn=parent_death_signal(),  # noqa: PLW1509
            )
            self._reaper = _start_reaper(self.process.pid)
        except OSError as exc:
            raise TargetError(
                self.secrets.redact(
                    f"target.command: cannot start {self.argv[0]!r}: {exc.strerror or exc}"
                ),
                hint="give the program's path or a name on PATH; `{python}` is the Python "
                "running optlab",
            ) from None
        self.started_at = time.monotonic()
        self._reader = threading.Thread(
            target=self._read_output, name="optlab-service-log", daemon=True
        )
        self._reader.start()
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self) -> None:
        deadline = self.started_at + self.target.ready_timeout_s
        while True:
            self.check("before it was ready")
            if self._healthy():
                self.ready_s = time.monotonic() - self.started_at
                self._record_processes()
                return
            if time.monotonic() >= deadline:
                what = self.health_url or f"a connection to {self.host}:{self.port}"
                raise TargetError(
                    self._with_tail(
                        f"the service was not ready within {self.target.ready_timeout_s:g} s "
                        f"({what} did not answer)"
                    ),
                    hint="raise target.ready_timeout_s, or check target.health_url and the "
                    "port the command listens on",
                )
            time.sleep(POLL_S)

    def _healthy(self) -> bool:
        if self.health_url is None:
            return _listening(self.host, self.port)
        try:
            with urllib.request.urlopen(self.health_url, timeout=HEALTH_TIMEOUT_S) as response:
                return 200 <= int(response.status) < 300
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def check(self, when: str = "during the run") -> None:
        """Raise TargetError with the log tail if the service is gone."""
        process = self.process
        if process is None or self._stopping:
            return
        code = process.poll()
        if code is not None:
            elapsed = time.monotonic() - self.started_at
            raise TargetError(
                self._with_tail(
                    f"the service {describe_exit(code)} {when} ({elapsed:.1f} s after it started)"
                ),
                hint="the log tail above is the service's own output",
            )

    def stop(self) -> None:
        """SIGTERM to the process group, SIGKILL after the grace period; idempotent."""
        process = self.process
        if process is None or self._stopping:
            return
        self._stopping = True
        if process.poll() is None:
            self._record_processes()  # workers started lazily, under load, are there by now
            self._signal(signal.SIGTERM)
            try:
                process.wait(self.target.stop_grace_s)
                self.stopped_with = "SIGTERM"
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
                process.wait()
                self.stopped_with = f"SIGKILL after {self.target.stop_grace_s:g} s"
        # Whatever is left in the group (a worker the service forked and orphaned) goes too.
        self._signal(signal.SIGKILL)
        _release_reaper(self._reaper)
        if self._reader is not None:
            self._reader.join(2.0)

    def _signal(self, signum: int) -> None:
        assert self.process is not None
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signum)

    def _record_processes(self) -> None:
        """Note the command line and executable of every process in the service's tree."""
        if self.process is None:
            return
        try:
            root = psutil.Process(self.process.pid)
            tree = [root, *root.children(recursive=True)]
        except psutil.Error:
            return
        counts: collections.Counter[tuple[str, ...]] = collections.Counter()
        for proc in tree:
            try:
                cmdline = tuple(proc.cmdline())
                exe = proc.exe()
            except psutil.Error:  # gone already, or another user's: nothing to note
                continue
            counts[cmdline] += 1
            if cmdline not in self._processes and len(self._processes) < MAX_PROCESSES:
                self._processes[cmdline] = {"cmdline": list(cmdline), "exe": exe, "count": 0}
        for cmdline, count in counts.items():
            if cmdline in self._processes:
                entry = self._processes[cmdline]
                entry["count"] = max(entry["count"], count)

    # -- output ---------------------------------------------------------------------------------
    def _read_output(self) -> None:
        process = self.process
        assert process is not None and process.stdout is not None
        for raw in iter(process.stdout.readline, b""):
            self._lines.append(raw.decode("utf-8", "replace").rstrip()[:LOG_LINE_CHARS])
        process.stdout.close()

    def log_tail(self) -> list[str]:
        return [self.secrets.redact(line) for line in list(self._lines)]

    def _with_tail(self, message: str) -> str:
        tail = self.log_tail()
        text = message + (
            f"; last {len(tail)} log lines:\n" + "\n".join(f"  | {line}" for line in tail)
            if tail
            else "; it printed nothing"
        )
        return self.secrets.redact(text)

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def info(self) -> dict[str, Any]:
        """What is stored with the run: the command as run (secrets redacted), its process
        tree's command lines, how it ended."""
        code = self.process.poll() if self.process is not None else None
        return {
            "command": [self.secrets.redact(arg) for arg in self.argv],
            "pid": self.pid,
            "ready_s": None if self.ready_s is None else round(self.ready_s, 3),
            "exit": None if code is None else describe_exit(code),
            "stopped_with": self.stopped_with,
            "log_tail": self.log_tail(),
            # The process tree while it ran: the exe shows which interpreter really served.
            "processes": self.secrets.redact_any(
                [dict(entry) for entry in self._processes.values()]
            ),
        }
