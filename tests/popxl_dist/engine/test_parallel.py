"""The op threads: every block runs exactly once, on the calling thread and its helpers at once;
failures come back to the caller; floating-point checks keep the blocks on the calling thread."""
import threading

import numpy as np
import pytest

from popxl.engine import parallel
from popxl.engine.kernels._util import fp_events
from popxl.engine.parallel import current_threads, run_blocks, threads


def test_every_block_once_whatever_the_thread_count():
    for t in (1, 2, 3, 8):
        for n in (0, 1, 2, 5, 64):
            seen = []
            with threads(t):
                run_blocks(n, seen.append)
            assert sorted(seen) == list(range(n)), (t, n)


def test_blocks_run_on_several_threads_at_once():
    """Two blocks that each wait for the other: they finish only if two threads run them."""
    barrier = threading.Barrier(2, timeout=20)
    who = []

    def block(i):
        who.append(threading.get_ident())
        barrier.wait()

    with threads(2):
        run_blocks(2, block)
    assert len(set(who)) == 2 and threading.get_ident() in who


def test_one_thread_runs_the_blocks_here_in_order():
    who, order = set(), []
    with threads(1):
        run_blocks(6, lambda i: (who.add(threading.get_ident()), order.append(i)))
    assert who == {threading.get_ident()} and order == list(range(6))


def test_thread_count_is_the_calling_threads():
    assert current_threads() == 1
    with threads(4):
        assert current_threads() == 4
        seen = []
        t = threading.Thread(target=lambda: seen.append(current_threads()))
        t.start()
        t.join()
        assert seen == [1]                     # another thread: its own setting
        with threads(2):
            assert current_threads() == 2
        assert current_threads() == 4
    assert current_threads() == 1


def test_the_lowest_failing_block_is_raised_after_the_others_stop():
    running = []

    def block(i):
        running.append(i)
        if i in (3, 5):
            raise ValueError(f"block {i}")

    with threads(3):
        with pytest.raises(ValueError, match="block 3"):
            run_blocks(8, block)
    with threads(3):                           # the pool still works afterwards
        seen = []
        run_blocks(4, seen.append)
        assert sorted(seen) == [0, 1, 2, 3]


def test_floating_point_checks_keep_the_blocks_on_the_calling_thread():
    who = set()
    with threads(4), fp_events(dict(all="raise")):
        run_blocks(4, lambda i: who.add(threading.get_ident()))
    assert who == {threading.get_ident()}


def test_helpers_use_the_callers_numpy_error_state():
    states = []

    def block(i):
        states.append(np.geterr()["over"])

    with threads(2), np.errstate(over="ignore"):
        run_blocks(8, block)
    with threads(2), np.errstate(over="warn"):
        run_blocks(8, block)
    assert states[:8] == ["ignore"] * 8 and states[8:] == ["warn"] * 8


def test_nested_blocks_and_concurrent_callers():
    out = np.zeros((4, 16), np.int64)

    def outer(i):
        run_blocks(16, lambda j: out[i].__setitem__(j, i * 16 + j))

    def caller(rows):
        with threads(3):
            run_blocks(len(rows), lambda k: outer(rows[k]))

    ts = [threading.Thread(target=caller, args=(r,)) for r in ([0, 1], [2, 3])]
    for t in ts:
        t.start()
    for t in ts:
        t.join(30)
    assert (out.reshape(-1) == np.arange(64)).all()
    assert parallel._POOL.wanted == 0
