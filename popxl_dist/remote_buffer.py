"""Remote buffers and remote / replica-sharded variables.

Not implemented yet: they arrive with the remote-buffers issue. Each entry point raises
NotImplementedError naming what is missing, so programs fail at the call that needs them.
"""
from __future__ import annotations

__all__ = ["RemoteBuffer", "remote_buffer", "remote_variable", "remote_replica_sharded_variable",
           "replica_sharded_variable", "replica_sharded_buffer"]

_MSG = ("{name} is not implemented yet in popxl-dist: remote buffers, remote variables and "
        "replicated tensor sharding arrive with the remote-buffers issue")


class RemoteBuffer:
    def __init__(self, *args, **kwargs):
        raise NotImplementedError(_MSG.format(name="RemoteBuffer"))


def remote_buffer(*args, **kwargs):
    raise NotImplementedError(_MSG.format(name="remote_buffer"))


def remote_variable(*args, **kwargs):
    raise NotImplementedError(_MSG.format(name="remote_variable"))


def remote_replica_sharded_variable(*args, **kwargs):
    raise NotImplementedError(_MSG.format(name="remote_replica_sharded_variable"))


def replica_sharded_variable(*args, **kwargs):
    raise NotImplementedError(_MSG.format(name="replica_sharded_variable"))


def replica_sharded_buffer(*args, **kwargs):
    raise NotImplementedError(_MSG.format(name="replica_sharded_buffer"))
