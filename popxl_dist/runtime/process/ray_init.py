"""Joining Ray for a job: the cluster named by `POPXL_RAY_ADDRESS` / `RAY_ADDRESS`, or a new local
Ray that only this machine's processes can reach.

A local Ray started here listens on the loopback only: Ray binds its servers (GCS, raylet, the
workers' gRPC servers) on every interface when its node address is a network address, and on
the loopback when the node address is the loopback, which it takes when clusters are off
(`RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`, set while it starts). Where the installed Ray has token
authentication (`RAY_AUTH_MODE=token`; checked by module, `has_token_auth`), every connection
must also carry a random per-job token (`RAY_AUTH_TOKEN`, in this process's environment only,
inherited by the Ray processes it starts; never written to a file), unless the user chose an
authentication mode. A job on a cluster uses the cluster's own settings: its nodes listen on
their network addresses, protected by whatever authentication the cluster was started with.
"""
from __future__ import annotations

import importlib.util
import ipaddress
import logging
import os
import secrets
from typing import Dict, Optional

from ..env import ray_address
from .ray_quiet import quiet_ray_start

__all__ = ["init_ray", "spans_nodes", "has_token_auth", "LOOPBACK_ENV"]

LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def has_token_auth() -> bool:
    """Whether the installed Ray offers token authentication (`RAY_AUTH_MODE=token`)."""
    try:
        return importlib.util.find_spec("ray._private.authentication") is not None
    except ImportError:
        return False


def _local_env() -> Dict[str, str]:
    """Environment for a local Ray: loopback only, and a per-job token unless the user chose
    an authentication mode."""
    env = {LOOPBACK_ENV: "0"}
    if has_token_auth() and "RAY_AUTH_MODE" not in os.environ:
        env["RAY_AUTH_MODE"] = "token"
        env["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
    return env


def init_ray(cpus: int, actors: Optional[int] = None, prog: str = "popxl") -> bool:
    """Connect this process to Ray (unless it already is) for a job of `actors` actors (default
    `cpus`); True if it started a new local Ray (then it must shut it down). `prog` names the
    program in the one line said when a local Ray starts."""
    import ray

    if ray.is_initialized():
        return False
    quiet = {"logging_level": logging.WARNING, "configure_logging": False}
    address = ray_address()
    quiet_ray_start(starting_local=not address, actors=cpus if actors is None else actors,
                    prog=prog)
    if address:
        ray.init(address=address, **quiet)
        return False
    env = _local_env()
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    if "RAY_AUTH_TOKEN" in env:
        _reload_auth_config()
    constants = _ray_constants()
    cluster = getattr(constants, "ENABLE_RAY_CLUSTER", None)
    if cluster is not None:            # (read when ray was imported, maybe before this)
        constants.ENABLE_RAY_CLUSTER = False
    try:
        # address="local": a new Ray, not the one `ray start` last left on this machine.
        ray.init(address="local", num_cpus=cpus, include_dashboard=False, **quiet)
    finally:
        if cluster is not None:
            constants.ENABLE_RAY_CLUSTER = cluster
        if saved[LOOPBACK_ENV] is None:
            os.environ.pop(LOOPBACK_ENV, None)
        else:
            os.environ[LOOPBACK_ENV] = saved[LOOPBACK_ENV]
    ip = ray.util.get_node_ip_address()
    if not ipaddress.ip_address(ip).is_loopback:
        logging.getLogger("popxl").warning(
            "the local Ray listens on %s, not on the loopback: other machines can reach it", ip)
    return True


def _reload_auth_config() -> None:
    """Make this process's Ray read the authentication settings just put in the environment
    (Ray reads them once, maybe when it was imported)."""
    try:
        from ray._raylet import AuthenticationTokenLoader, Config
    except ImportError:
        return
    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


def _ray_constants():
    try:
        from ray._private import ray_constants
    except ImportError:
        return None
    return ray_constants


def spans_nodes() -> bool:
    """Whether the Ray this process joined has more than one live node (the job's processes
    may then be on several machines)."""
    import ray

    return sum(1 for n in ray.nodes() if n.get("Alive")) > 1
