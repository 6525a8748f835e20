"""A dashboard whose terminal goes away without a SIGHUP ends, rather than spinning on."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from app.hangup import EXIT_STATUS, hung_up

CHILD = """
import sys, time
from app.hangup import exit_on_hangup
exit_on_hangup(0, interval=0.05)
print("watching", flush=True)
time.sleep(30)
"""


def test_a_live_terminal_is_not_hung_up_and_a_closed_one_is():
    master, slave = os.openpty()
    try:
        assert not hung_up(slave)
        os.write(master, b"x\n")  # input waiting is not a hang-up, and is not taken
        assert not hung_up(slave) and os.read(slave, 2) == b"x\n"
        os.close(master)
        assert hung_up(slave)
    finally:
        os.close(slave)


def test_the_process_ends_when_its_terminal_closes():
    master, slave = os.openpty()
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdin=slave,
                             stdout=subprocess.PIPE, start_new_session=True)  # no SIGHUP
    os.close(slave)
    try:
        assert child.stdout is not None and child.stdout.readline() == b"watching\n"
        assert child.poll() is None  # the terminal is there: it keeps running
        started = time.monotonic()
        os.close(master)
        assert child.wait(timeout=10) == EXIT_STATUS
        assert time.monotonic() - started < 10
    finally:
        if child.poll() is None:
            child.kill()
