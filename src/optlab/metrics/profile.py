"""Sampling a target's process with py-spy over the measured phase (`optlab run --profile`).

`Profiler(pid)` runs py-spy (`record --format raw --threads --nonblocking`) against the
process that runs the target: optlab's own for an in-process target, the service's for a
command target. `--nonblocking` reads the target's memory without pausing it, so a sample
may now and then show a torn stack; the target's own speed is what a run measures.

What py-spy writes, and why three samplers: a raw line is one stack with its count
(`thread (TID): NAME;outer (file:line);...;leaf (file:line) COUNT`). Whether a thread was
idle or held the GIL is known to py-spy at each sample but not written; `--idle` and `--gil`
only filter which samples are kept. So the profiler runs three py-spy processes side by side
over the same window, at the same rate, one per filter:

- `all` (`--idle`): every thread at every tick. Its counts are the thread's samples and the
  shares of its leaf frames, waits included (a thread blocked on a lock shows where it waits);
  the thread sampled most often gives the number of ticks (`samples`).
- `active` (no `--idle`): the samples in which a thread was running. `idle_pct` is the share
  of `all`'s thread-samples that `active` lacks: 100 * (1 - active / all).
- `gil` (`--gil --idle`): the samples of the thread that held the GIL, at most one a tick.
  `gil_pct` = gil / ticks: the share of ticks in which some thread held the GIL.

The trade-off: three samplers cost three times one, and the ratios come from different
samplers, whose tick counts differ by their attach times and by the ticks each falls behind
on a busy host (up to ~10% over 2 s on two loaded cores, less over a longer phase); both
percentages are clamped to 0..100. py-spy's own `top` shows the
same two figures but only on a terminal. At the default 100 Hz each sampler uses a few
percent of one core, and the target is never paused.

py-spy never outlives optlab: `stop()` interrupts every sampler (SIGINT, so it writes its
file) and kills one that does not exit; use the profiler as a context manager or call
`stop()` in a `finally`. A sampler also ends when its target ends, and `max_s` (py-spy's
`--duration`) bounds it even if optlab is killed outright. A target that dies early leaves
what was sampled until then. py-spy must be allowed to read the target's memory (ptrace):
as root, with CAP_SYS_PTRACE, or as the target's user where kernel.yama.ptrace_scope is 0;
under ptrace_scope 1 an in-process target names any process of its user as its ptracer
(`PR_SET_PTRACER`) for the profile's length, since py-spy, optlab's child, is not its
ancestor.

The result is a `Profile`, whose fields are those of the run summary's `ProfileEvidence`
(docs/schemas/run-summary.schema.json); this layer does not import the store, so the run
builds the evidence with `ProfileEvidence.model_validate(dataclasses.asdict(profile))`.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from optlab.errors import ConfigError

__all__ = [
    "MAX_FRAMES",
    "MAX_THREADS",
    "Profile",
    "ProfileFrameShare",
    "Profiler",
    "ProfilerError",
    "find_py_spy",
    "parse_profile",
    "parse_raw",
]

MAX_THREADS = 8
MAX_FRAMES = 5
INSTALL_HINT = "pip install py-spy (or: pip install 'optlab[profile]')"
# How long py-spy may take to attach (it retries a few times) and to write its file.
ATTACH_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 10.0
_MODES: dict[str, tuple[str, ...]] = {
    "all": ("--idle",),
    "active": (),
    "gil": ("--gil", "--idle"),
}
_THREAD = re.compile(r"^thread \((?P<tid>[^)]*)\)(?:: (?P<name>.*))?$")
_PR_SET_PTRACER = 0x59616D61
_PR_SET_PTRACER_ANY = -1


class ProfilerError(ConfigError):
    """py-spy is missing, may not read the target's memory, or could not attach to it."""


@dataclass(frozen=True)
class ProfileFrameShare:
    thread: str
    frame: str  # "function (file:line)"
    share_pct: float  # of the thread's samples


@dataclass(frozen=True)
class Profile:
    """The fields of `ProfileEvidence`. `samples`: ticks, each sampling every thread."""

    tool: str = "py-spy"
    pid: int | None = None
    samples: int = 0
    gil_pct: float | None = None
    idle_pct: float | None = None
    frames: tuple[ProfileFrameShare, ...] = ()


# -- parsing (pure) ---------------------------------------------------------------------


def parse_raw(text: str) -> dict[str, Counter[str]]:
    """py-spy's raw (collapsed) output with `--threads`: per thread, the count of each leaf
    frame. A thread is "NAME (TID)", or "TID" where py-spy found no name; a stack with no
    Python frame counts as "(no Python frame)"."""
    threads: dict[str, Counter[str]] = {}
    for line in text.splitlines():
        stack, _, count = line.rstrip().rpartition(" ")
        if not stack or not count.isdigit():
            continue
        parts = stack.split(";")
        match = _THREAD.match(parts[0])
        if match is None:
            thread, frames = "", parts
        else:
            tid, name = match.group("tid"), match.group("name")
            thread, frames = (f"{name} ({tid})" if name else tid), parts[1:]
        leaf = frames[-1] if frames else "(no Python frame)"
        threads.setdefault(thread, Counter())[leaf] += int(count)
    return threads


def parse_profile(
    all_raw: str,
    active_raw: str | None = None,
    gil_raw: str | None = None,
    *,
    pid: int | None = None,
    max_threads: int = MAX_THREADS,
    max_frames: int = MAX_FRAMES,
) -> Profile:
    """The profile from the three samplers' raw outputs (module docstring); without
    `active_raw` or `gil_raw`, `idle_pct` or `gil_pct` is None. Threads come busiest first
    (most running samples, then most samples), each with its top leaf frames."""
    every = parse_raw(all_raw)
    totals = {thread: sum(leaves.values()) for thread, leaves in every.items()}
    ticks = max(totals.values(), default=0)
    thread_samples = sum(totals.values())
    if ticks == 0:
        return Profile(pid=pid)
    running: dict[str, int] = {}
    idle_pct = None
    if active_raw is not None:
        running = {t: sum(leaves.values()) for t, leaves in parse_raw(active_raw).items()}
        idle_pct = _pct(1.0 - sum(running.values()) / thread_samples)
    gil_pct = None
    if gil_raw is not None:
        held = sum(sum(leaves.values()) for leaves in parse_raw(gil_raw).values())
        gil_pct = _pct(held / ticks)
    order = sorted(every, key=lambda t: (-running.get(t, 0), -totals[t], t))
    frames = tuple(
        ProfileFrameShare(thread=thread, frame=leaf, share_pct=round(100.0 * n / totals[thread], 1))
        for thread in order[:max_threads]
        for leaf, n in sorted(every[thread].items(), key=lambda kv: (-kv[1], kv[0]))[:max_frames]
    )
    return Profile(pid=pid, samples=ticks, gil_pct=gil_pct, idle_pct=idle_pct, frames=frames)


def _pct(share: float) -> float:
    return round(100.0 * min(1.0, max(0.0, share)), 1)


# -- running py-spy -----------------------------------------------------------------------


def find_py_spy(dirs: Sequence[str] | None = None) -> str:
    """The py-spy executable: in `dirs`, or else beside this Python (a virtualenv that is not
    activated) and then on PATH."""
    if dirs is None:
        dirs = [str(Path(sys.executable).parent), *os.get_exec_path()]
    found = shutil.which("py-spy", path=os.pathsep.join(dirs))
    if found is None:
        raise ProfilerError("py-spy is not installed: `--profile` samples with it", INSTALL_HINT)
    return found


class Profiler:
    """py-spy samplers of process `pid` from `start()` to `stop()` (module docstring)."""

    def __init__(
        self,
        pid: int,
        rate_hz: int = 100,
        *,
        executable: str | None = None,
        max_s: float | None = None,
    ) -> None:
        if rate_hz < 1:
            raise ValueError("rate_hz must be at least 1")
        self.pid = pid
        self.rate_hz = rate_hz
        self.max_s = max_s
        self._executable = executable
        self._dir: tempfile.TemporaryDirectory[str] | None = None
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._ptracer_set = False
        # What the last `stop()` returned: the result of a `with` block.
        self.profile: Profile | None = None

    def __enter__(self) -> Profiler:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return bool(self._procs)

    def start(self) -> None:
        """Start the samplers and return once every one samples; raises `ProfilerError` when
        py-spy is missing or cannot attach (nothing is left running then)."""
        if self._procs:
            raise RuntimeError("the profiler is already running")
        self.profile = None
        executable = self._executable or find_py_spy()
        if self._executable is not None and shutil.which(executable) is None:
            raise ProfilerError(f"py-spy not found at {executable}", INSTALL_HINT)
        self._dir = tempfile.TemporaryDirectory(prefix="optlab-profile-")
        self._allow_ptrace()
        try:
            for mode, flags in _MODES.items():
                self._procs[mode] = self._spawn(executable, mode, flags)
            self._wait_attached()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> Profile:
        """Stop every sampler and return what they sampled (empty where nothing was); once
        stopped, the same profile again."""
        if not self._procs and self._dir is None and self.profile is not None:
            return self.profile
        procs, self._procs = self._procs, {}
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for proc in procs.values():
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._restore_ptrace()
        texts = {mode: "" for mode in _MODES}
        if self._dir is not None:
            folder = Path(self._dir.name)
            texts = {mode: _read(folder / f"{mode}.txt") for mode in _MODES}
            self._dir.cleanup()
            self._dir = None
        self.profile = parse_profile(texts["all"], texts["active"], texts["gil"], pid=self.pid)
        return self.profile

    def _spawn(self, executable: str, mode: str, flags: tuple[str, ...]) -> subprocess.Popen[bytes]:
        assert self._dir is not None
        folder = Path(self._dir.name)
        command = [executable, "record", "--format", "raw", "--threads", "--nonblocking"]
        command += [*flags, "--rate", str(self.rate_hz), "-o", str(folder / f"{mode}.txt")]
        if self.max_s is not None:
            command += ["--duration", str(max(1, math.ceil(self.max_s)))]
        command += ["--pid", str(self.pid)]
        # Files, not pipes: py-spy prints "behind in sampling" lines that nobody would drain.
        with open(folder / f"{mode}.out", "wb") as out, open(folder / f"{mode}.err", "wb") as err:
            return subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out, stderr=err)

    def _wait_attached(self) -> None:
        assert self._dir is not None
        folder = Path(self._dir.name)
        waiting = dict(self._procs)
        deadline = time.monotonic() + ATTACH_TIMEOUT_S
        while waiting:
            for mode, proc in list(waiting.items()):
                if b"Sampling process" in _read(folder / f"{mode}.out").encode():
                    del waiting[mode]
                elif proc.poll() is not None:
                    raise self._attach_error(_read(folder / f"{mode}.err"))
            if waiting and time.monotonic() > deadline:
                raise ProfilerError(
                    f"py-spy did not start sampling process {self.pid} within "
                    f"{ATTACH_TIMEOUT_S:.0f} s",
                    "check that the process is a running Python program",
                )
            time.sleep(0.01)

    def _attach_error(self, stderr: str) -> ProfilerError:
        lowered = stderr.lower()
        if "permission denied" in lowered or "operation not permitted" in lowered:
            return ProfilerError(
                f"py-spy may not read process {self.pid}'s memory: ptrace was denied",
                "run optlab as root or with CAP_SYS_PTRACE (in a container: --cap-add "
                "SYS_PTRACE), or allow ptrace between a user's processes: "
                "sudo sysctl kernel.yama.ptrace_scope=0",
            )
        first = next((line for line in stderr.splitlines() if line.strip()), "no message")
        return ProfilerError(
            f"py-spy could not sample process {self.pid}: {first.removeprefix('Error: ')}",
            "check that the process is running and is a Python program",
        )

    def _allow_ptrace(self) -> None:
        # Yama's ptrace_scope 1 lets a process read only its descendants; py-spy is ours.
        if self.pid != os.getpid() or _yama_scope() != 1:
            return
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PTRACER, _PR_SET_PTRACER_ANY, 0, 0, 0) == 0:
            self._ptracer_set = True

    def _restore_ptrace(self) -> None:
        if not self._ptracer_set:
            return
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PTRACER, 0, 0, 0, 0)
        self._ptracer_set = False


def _yama_scope() -> int | None:
    try:
        return int(Path("/proc/sys/kernel/yama/ptrace_scope").read_text().strip())
    except (OSError, ValueError):
        return None


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""
