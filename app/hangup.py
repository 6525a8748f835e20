"""Leaving when the terminal goes away.

A terminal closed under a full-screen app (a tmux session killed, an ssh link dropped)
does not always send SIGHUP: a process that is not its session's controlling process gets
none. Textual then blocks writing to the dead terminal and spins reading it, and the
process, with its embedded runtime and load, lives on at full CPU. A watcher polls the
terminal and ends the process when it has hung up.
"""

from __future__ import annotations

import os
import select
import threading

POLL_SECONDS = 0.5
GONE = select.POLLHUP | select.POLLERR | select.POLLNVAL
EXIT_STATUS = 129  # 128 + SIGHUP, as if the signal had come


def hung_up(fd: int) -> bool:
    """Has the terminal on `fd` hung up? Polls without reading, so no keystroke is taken."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return any(events & GONE for _, events in poller.poll(0))


def exit_on_hangup(fd: int, interval: float = POLL_SECONDS) -> threading.Thread:
    """A daemon thread ending the process (at once: nothing can be drawn any more) once
    the terminal on `fd` hangs up."""

    def watch() -> None:
        while not hung_up(fd):
            threading.Event().wait(interval)
        os._exit(EXIT_STATUS)

    thread = threading.Thread(target=watch, name="prism-hangup", daemon=True)
    thread.start()
    return thread
