"""The Ray backend's reaper (a process of its own, no Ray needed): what it does when the
driver dies without cleaning up, and when it cleaned up."""
from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid

from popxl.runtime.backends.ray import REAPER_SCRIPT as REAPER
from popxl.runtime.process.polling import process_alive, process_start_time


def _job(tmp_prefix: str):
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    seg = f"/dev/shm/{tmp_prefix}-0-1"
    with open(seg, "wb") as f:
        f.write(b"x")
    reaper = subprocess.Popen([sys.executable, REAPER], stdin=subprocess.PIPE, text=True)
    reaper.stdin.write(f"shm {tmp_prefix}\nkill {victim.pid} {process_start_time(victim.pid)}\n"
                       f"kill 999999999 5\n\nnonsense line\n")
    reaper.stdin.flush()
    return victim, seg, reaper


def test_reaper_kills_the_job_and_removes_segments_when_the_driver_dies():
    prefix = f"popxl-ray-test-{uuid.uuid4().hex[:8]}"
    victim, seg, reaper = _job(prefix)
    try:
        reaper.stdin.close()                 # the driver died: its end of the pipe closed
        assert reaper.wait(timeout=10) == 0
        assert victim.wait(timeout=10) == -9
        assert not os.path.exists(seg)
    finally:
        if victim.poll() is None:
            victim.kill()


def test_reaper_leaves_everything_after_done_and_spares_reused_pids():
    prefix = f"popxl-ray-test-{uuid.uuid4().hex[:8]}"
    victim, seg, reaper = _job(prefix)
    try:
        reaper.stdin.write("done\n")
        reaper.stdin.close()
        assert reaper.wait(timeout=10) == 0
        time.sleep(0.2)
        assert process_alive(victim.pid) and os.path.exists(seg)
        # a listed pid whose start time differs is another process now: not killed
        reaper = subprocess.Popen([sys.executable, REAPER], stdin=subprocess.PIPE, text=True)
        reaper.communicate(f"kill {victim.pid} {process_start_time(victim.pid) + 1}\n",
                           timeout=10)
        time.sleep(0.2)
        assert process_alive(victim.pid)
    finally:
        victim.kill()
        victim.wait()
        if os.path.exists(seg):
            os.unlink(seg)
