"""A goodbye that overtakes the data sent before it, made certain (`poprun --num-instances 2
python instance_goodbye.py`): MPI orders messages per communicator, and an instance's goodbye
(on the control communicator) can be read before its last collective data (on the data
communicator). Instance 1 does here what an overtaking goodbye looks like to instance 0: it
says goodbye (having sent one data message), and only a second later sends that data. Instance
0 reads the goodbye first, then waits in the collective: it must get the data, not
`InstanceFailed: instance 1 ended its script without joining this collective`.

Instance 0 prints `got N values` or `caught <error>`.
"""
from __future__ import annotations

import sys
import time

import numpy as np
import popdist

from popxl.popdist_env import InstancePlacement
from popxl.runtime.instances.join import instance_group

N, TAG = 100_000, 7


def main() -> int:
    index = popdist.getInstanceIndex()
    group = instance_group(InstancePlacement(num_instances=2, index=index, offset=index,
                                             local=1, total=2))
    group.next_run()
    tr = group.transport
    if index == 1:
        tr.sent_to[0] = tr.sent_to.get(0, 0) + 1        # the goodbye counts the data ...
        reqs = group._notify("bye", 1, "")
        time.sleep(1.0)                                 # ... which leaves a second later
        tr.sent_to[0] -= 1
        tr.exchange({0: np.arange(N, dtype=np.float32)}, {}, TAG)
        group.MPI.Request.Waitall(reqs)
        group.closed = True
        return 0
    deadline = time.monotonic() + 60
    while 1 not in group.gone:                          # the goodbye is in
        group._read_notices()
        assert time.monotonic() < deadline, "no goodbye from instance 1"
        time.sleep(0.01)
    try:
        got = tr.exchange({}, {1: (N, np.dtype(np.float32))}, TAG)[1]
    except Exception as e:  # noqa: BLE001 - reported
        print(f"caught {type(e).__name__}: {e}", flush=True)
        return 1
    assert np.array_equal(got, np.arange(N, dtype=np.float32))
    print(f"got {got.size} values", flush=True)
    group.closed = True
    return 0


if __name__ == "__main__":
    sys.exit(main())
