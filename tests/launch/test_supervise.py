"""`popxl_launch.supervise.run_job`, the way popxl-run runs mpiexec, on a stand-in child: a
stopping signal reaches the child, a child that ignores it is killed after the grace period,
and the child dies with a killed launcher. Processes are found by an environment marker."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from popxl_launch import supervise
from procs import marked_processes

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux /proc")

DRIVER = """
import sys
from popxl_launch.supervise import run_job
child = [sys.executable, "-c", sys.argv[1]]
print("code", run_job(child, dict(__import__("os").environ)), flush=True)
"""
CHILD = """
import os, signal, sys, time
if {ignore}:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("child", os.getpid(), os.environ["POPXL_LAUNCHER"], flush=True)
time.sleep(120)
"""


def _marked(tag: str) -> list:
    return marked_processes("SUPERVISE_TEST", tag)


def _start(ignore_term: bool):
    tag = uuid.uuid4().hex
    env = dict(os.environ, SUPERVISE_TEST=tag)
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, CHILD.format(ignore=ignore_term)],
                            stdout=subprocess.PIPE, text=True, env=env, start_new_session=True)
    line = proc.stdout.readline().split()
    assert line[0] == "child", line
    return proc, tag, int(line[1]), line[2]


def _gone(tag: str, timeout: float = 20) -> bool:
    deadline = time.monotonic() + timeout
    while _marked(tag):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.fixture
def cleanup():
    tags = []
    yield tags
    for tag in tags:
        for pid in _marked(tag):
            os.kill(pid, signal.SIGKILL)


def test_sigterm_is_forwarded_and_the_code_is_128_plus_the_signal(cleanup):
    proc, tag, child, launcher = _start(ignore_term=False)
    cleanup.append(tag)
    assert launcher.split(":")[1] == str(proc.pid)       # the ranks watch the launcher
    os.kill(proc.pid, signal.SIGTERM)
    out = proc.communicate(timeout=30)[0]
    assert "code 143" in out
    assert _gone(tag)


def test_a_child_that_ignores_sigterm_is_killed_after_the_grace_period(cleanup):
    proc, tag, child, _ = _start(ignore_term=True)
    cleanup.append(tag)
    t0 = time.monotonic()
    os.kill(proc.pid, signal.SIGHUP)
    out = proc.communicate(timeout=30)[0]
    took = time.monotonic() - t0
    assert "code 129" in out
    assert supervise._GRACE <= took < supervise._GRACE + 10
    assert _gone(tag)


def test_the_child_dies_with_a_killed_launcher(cleanup):
    proc, tag, child, _ = _start(ignore_term=False)
    cleanup.append(tag)
    os.kill(proc.pid, signal.SIGKILL)         # no handler runs: the parent-death signal acts
    proc.wait(timeout=30)
    assert _gone(tag)
