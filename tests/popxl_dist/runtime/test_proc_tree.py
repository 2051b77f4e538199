"""descendants(): children and grandchildren of a process, from /proc."""
import os
import subprocess
import sys

import pytest

from popxl.runtime.process.proc_tree import descendants

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs /proc")


def test_children_and_grandchildren_parents_first():
    child = subprocess.Popen([sys.executable, "-c",
                              "import subprocess, sys; p = subprocess.Popen(['sleep', '30']);"
                              " print(p.pid, flush=True); sys.stdin.read()"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        grandchild = int(child.stdout.readline())
        found = descendants(os.getpid())
        assert child.pid in found and grandchild in found
        assert found.index(child.pid) < found.index(grandchild)
        assert descendants(grandchild) == []
    finally:
        for pid in (grandchild, child.pid):
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        child.wait()
