"""`popxl-replay BUNDLE [--replica R] [--pdb]`: run a recorded run again in this process, on
the local backend, with the same bits (see popxl.debug.replay). Exit status: 0 when the replay
gave the recorded outputs bitwise, 1 when it raised (a recorded failure reproduced), 3 when it
did something else than the recording (other outputs, a failure the recording did not have, or
no failure where it had one), 2 for a bad bundle."""
from __future__ import annotations

import argparse
import sys
from typing import List, Optional

__all__ = ["main"]


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text and text.strip() else ""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="popxl-replay",
                                description="Replay a run recorded with POPXL_RECORD=DIR (or "
                                            "popxl-run --record DIR) in one process.")
    p.add_argument("bundle", help="a bundle directory: DIR/<session>-run<n>")
    p.add_argument("--replica", type=int, default=None,
                   help="report this replica's outputs (and compare only them)")
    p.add_argument("--pdb", action="store_true",
                   help="on a failure, open pdb where the failing op ran (its generated code "
                        "is listed; `up` walks to the calls)")
    return p


def main(argv: Optional[List[str]] = None) -> int:
    ns = _parser().parse_args(argv)
    import numpy as np

    from popxl.debug import load_bundle, replay

    try:
        bundle = load_bundle(ns.bundle)
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    R = bundle.replication_factor
    if ns.replica is not None and not 0 <= ns.replica < R:
        print(f"popxl-replay: --replica must be in 0..{R - 1}, got {ns.replica}",
              file=sys.stderr)
        return 2
    print(f"popxl-replay: {bundle.session} run {bundle.run}, {R} replica(s) from "
          f"{len(bundle.parts)} part(s), replayed in one process")
    result = replay(ns.bundle)
    if result.error is not None:
        err = result.error
        print(f"the replay raised {type(err).__name__}: {err}", file=sys.stderr)
        recorded = bundle.recorded_error
        if recorded:
            same = (_first_line(recorded).split(": ", 1)[-1]
                    == _first_line(str(err)))
            print(f"popxl-replay: {'the same error as' if same else 'a different error than'} "
                  f"the recorded run ({_first_line(recorded)})")
        else:
            print("popxl-replay: the recorded run did not fail")
        if ns.pdb:
            import pdb

            tb = err.__traceback__
            cause = err.__cause__ or err.__context__
            pdb.post_mortem(cause.__traceback__ if cause is not None and
                            cause.__traceback__ is not None else tb)
        return 1 if recorded else 3
    if bundle.failed:
        print(f"popxl-replay: the replay did not fail, but the recorded run did "
              f"({_first_line(bundle.recorded_error or '')})")
        return 3
    replicas = range(R) if ns.replica is None else [ns.replica]
    for sid, arr in result.outputs.items():
        for r in replicas:
            v = arr[:, r]
            print(f"  {sid} replica {r}: shape {v.shape[1:] if v.shape[0] == 1 else v.shape} "
                  f"{v.dtype}, sum {np.asarray(v, np.float64).sum():.9g}")
    if result.recorded_outputs is None:
        print("popxl-replay: no recorded outputs to compare with")
        return 0
    same = all(result.outputs[k][:, list(replicas)].tobytes()
               == result.recorded_outputs[k][:, list(replicas)].tobytes()
               for k in result.recorded_outputs)
    print(f"popxl-replay: outputs {'identical to' if same else 'DIFFERENT from'} the recorded "
          f"run's (bitwise)")
    return 0 if same else 3


if __name__ == "__main__":
    sys.exit(main())
