"""Ray's start-up noise, handled in one place (called after `import ray`, before `ray.init`, by
the Ray backend and the Ray instance launcher):

- Ray 2.5x logs "Token authentication is enabled for this Ray cluster ..." on every local
  start: that notice is dropped (Ray's other authentication warnings, such as authentication
  being disabled, still show).
- Ray's CLI logger calls `colorama.init()`, whose exit hook writes `ESC[0m` to a terminal after
  the script's last line: the hook is not registered.
- A local Ray takes a few seconds to start: one line on stderr says so.
"""
from __future__ import annotations

import atexit
import logging
import sys

__all__ = ["quiet_ray_start"]

_TOKEN_NOTICE = "Token authentication is enabled for this Ray cluster"
_AUTH_LOGGER = "ray._private.authentication.authentication_token_setup"


class _DropTokenNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(_TOKEN_NOTICE)


def quiet_ray_start(starting_local: bool, actors: int, prog: str = "popxl") -> None:
    """Before `ray.init`: drop the token notice, keep colorama's exit hook away, and, when a
    local Ray is about to start for `actors` actors, say so in one line."""
    logger = logging.getLogger(_AUTH_LOGGER)
    if not any(isinstance(f, _DropTokenNotice) for f in logger.filters):
        logger.addFilter(_DropTokenNotice())
    colorama = sys.modules.get("colorama")           # Ray's vendored copy, imported by `ray`
    initialise = getattr(colorama, "initialise", None)
    if initialise is not None and hasattr(initialise, "reset_all"):
        initialise.atexit_done = True                # a later colorama.init() adds no hook
        atexit.unregister(initialise.reset_all)
    if starting_local:
        print(f"{prog}: starting a local Ray for {actors} actor{'s' if actors != 1 else ''} "
              f"(a few seconds; POPXL_RAY_ADDRESS=HOST:PORT uses a running cluster instead)",
              file=sys.stderr, flush=True)
