"""Run a command in a new Linux time namespace whose CLOCK_MONOTONIC is shifted by OFFSET
seconds (fractions too): `python timens.py 3.7 -- ray start ...`. Root (CAP_SYS_ADMIN) and a
kernel with time namespaces (5.6+) are needed; exits 125 with the reason otherwise."""

from __future__ import annotations

import ctypes
import os
import sys

CLONE_NEWTIME = 0x00000080
CLOCK_MONOTONIC = 1


def main() -> int:
    offset, sep, *command = sys.argv[1:]
    if sep != "--" or not command:
        print("usage: timens.py OFFSET -- COMMAND...", file=sys.stderr)
        return 2
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWTIME) != 0:
        print(f"timens: unshare(CLONE_NEWTIME): {os.strerror(ctypes.get_errno())}", file=sys.stderr)
        return 125
    total_ns = round(float(offset) * 1e9)
    seconds, nanoseconds = divmod(total_ns, 1_000_000_000)
    # Written before any process enters the namespace: the next child is its first.
    with open("/proc/self/timens_offsets", "w") as f:
        f.write(f"{CLOCK_MONOTONIC} {seconds} {nanoseconds}\n")
    pid = os.fork()
    if pid == 0:
        os.execvp(command[0], command)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


if __name__ == "__main__":
    sys.exit(main())
