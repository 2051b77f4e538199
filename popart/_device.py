"""`popart.DeviceInfo`: the device a session runs on. Every device is the NumPy emulator."""
from __future__ import annotations

__all__ = ["DeviceInfo", "DeviceType"]

import enum


class DeviceType(enum.Enum):
    IpuModel = 0
    Cpu = 1
    Ipu = 2
    OfflineIpu = 3
    Sim = 4


_TYPES = {"ipu_hw": DeviceType.Ipu, "ipu_model": DeviceType.IpuModel, "cpu": DeviceType.Cpu}


class DeviceInfo:
    """A device of `num_ipus` IPUs (upstream `popart.DeviceInfo`); emulated, so it attaches
    without hardware and never runs out of devices."""

    def __init__(self, device_type: str = "ipu_hw", num_ipus: int = 1,
                 id: int = 0) -> None:  # noqa: A002 - upstream's name
        if device_type not in _TYPES:
            raise ValueError(f"DeviceInfo: device type must be one of {sorted(_TYPES)}, got "
                             f"{device_type!r}")
        if not isinstance(num_ipus, int) or num_ipus < 1:
            raise ValueError(f"DeviceInfo: num_ipus must be a positive int, got {num_ipus!r}")
        self._desc = device_type
        self._num_ipus = num_ipus
        self._id = id
        self._attached = False

    @property
    def type(self) -> DeviceType:  # noqa: A003 - upstream's name
        return _TYPES[self._desc]

    @property
    def numIpus(self) -> int:
        return self._num_ipus

    @property
    def id(self) -> int:  # noqa: A003
        return self._id

    @property
    def isAttached(self) -> bool:
        return self._attached

    def attach(self) -> bool:
        self._attached = True
        return True

    def detach(self) -> None:
        self._attached = False

    def __repr__(self) -> str:
        return f"DeviceInfo(type={self._desc}, numIpus={self._num_ipus}, id={self._id})"
