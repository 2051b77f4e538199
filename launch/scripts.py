"""Running a user's script unchanged as `__main__` (the host program), returning its exit code."""
from __future__ import annotations

import os
import runpy
import sys
import traceback
from typing import Callable, Optional, Sequence

__all__ = ["run_script"]


def run_script(path: str, args: Sequence[str],
               on_exception: Optional[Callable[[BaseException], None]] = None) -> int:
    """Run `path` with `sys.argv = [path, *args]` like `python path args...`; the exit code is
    the script's (1 for an uncaught exception, whose traceback is printed and which is passed
    to `on_exception`)."""
    if not os.path.isfile(path):
        print(f"popxl-run: no such script: {path}", file=sys.stderr)
        return 2
    old_argv, old_path0 = sys.argv, sys.path[0] if sys.path else None
    sys.argv = [path, *args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    try:
        runpy.run_path(path, run_name="__main__")
        return 0
    except SystemExit as e:
        code = e.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code
        print(code, file=sys.stderr)
        return 1
    except KeyboardInterrupt as e:
        # Ctrl-C is no crash: one line, no traceback.
        print(f"popxl-run: {os.path.basename(path)} interrupted (Ctrl-C)", file=sys.stderr,
              flush=True)
        if on_exception is not None:
            on_exception(e)
        return 130
    except BaseException as e:  # noqa: BLE001 - reported like the interpreter does
        traceback.print_exc()
        if on_exception is not None:
            on_exception(e)
        return 1
    finally:
        sys.argv = old_argv
        if old_path0 is not None and sys.path and sys.path[0] != old_path0:
            sys.path.pop(0)
