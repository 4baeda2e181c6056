"""PID 1's duties: signals forwarded to the server, orphans reaped, the server's status as
the container's."""

from __future__ import annotations

import os
import signal

FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
                     signal.SIGUSR2)
CRASH_SIGNALS = frozenset({signal.SIGABRT, signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE,
                           signal.SIGILL, signal.SIGKILL})
"""Signals that end a server by a crash (SIGKILL: the kernel's OOM killer) and not by a stop:
a server they end is started again, unless the supervisor forwarded a stop signal."""
STOPPING_SIGNALS = frozenset({signal.SIGINT, signal.SIGHUP, signal.SIGQUIT})


def exit_code(wait_status: int) -> int:
    """A shell's ``$?`` for a child's wait status: its exit code, or 128 + the signal.
    (Not ``os.waitstatus_to_exitcode``: the Python of an Ubuntu 20.04 release image is 3.8.)"""
    if os.WIFSIGNALED(wait_status):
        return 128 + os.WTERMSIG(wait_status)
    return os.WEXITSTATUS(wait_status)


def crash_signal(wait_status: int) -> signal.Signals | None:
    """The crash signal that ended a server (see :data:`CRASH_SIGNALS`), else None."""
    if os.WIFSIGNALED(wait_status) and os.WTERMSIG(wait_status) in CRASH_SIGNALS:
        return signal.Signals(os.WTERMSIG(wait_status))
    return None


def forward_signal(pid: int, number: int) -> None:
    try:
        os.kill(pid, number)
    except ProcessLookupError:
        pass


def reap_until(pid: int) -> int:
    """Reap every child (orphans are ours as PID 1) until ``pid`` exits; its wait status."""
    while True:
        try:
            reaped, status = os.waitpid(-1, 0)
        except ChildProcessError:  # gone without our wait: cannot happen, but never spin
            return 0
        if reaped == pid:
            return status
