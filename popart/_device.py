"""`popart.DeviceInfo` and `popart.DeviceManager`: the devices a session runs on. Every
device is the NumPy emulator: acquiring one always succeeds, whatever its kind."""
from __future__ import annotations

__all__ = ["DeviceInfo", "DeviceType", "DeviceManager", "SyncPattern", "DeviceConnectionType",
           "DeviceSelectionCriterion"]

import enum
from typing import List, Mapping, Optional


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
                 id: int = 0, tiles: int = 0) -> None:  # noqa: A002 - upstream's name
        if device_type not in _TYPES:
            raise ValueError(f"DeviceInfo: device type must be one of {sorted(_TYPES)}, got "
                             f"{device_type!r}")
        if not isinstance(num_ipus, int) or num_ipus < 1:
            raise ValueError(f"DeviceInfo: num_ipus must be a positive int, got {num_ipus!r}")
        self._desc = device_type
        self._num_ipus = num_ipus
        self._id = id
        self._tiles = tiles or 1472          # an IPU's tiles (Mk2) unless a count was asked for
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

    def tryAttachUntilTimeout(self) -> bool:
        """Attach (an emulated device is always free)."""
        return self.attach()

    def detach(self) -> None:
        self._attached = False

    @property
    def tilesPerIPU(self) -> int:
        return self._tiles

    tilesPerIpu = tilesPerIPU

    def __enter__(self) -> "DeviceInfo":
        return self

    def __exit__(self, *exc) -> None:
        self.detach()

    def __repr__(self) -> str:
        return f"DeviceInfo(type={self._desc}, numIpus={self._num_ipus}, id={self._id})"


class SyncPattern(enum.Enum):
    """How the IPUs of a device synchronise (accepted; the emulator has one pattern)."""
    Full = 0
    SinglePipeline = 1
    ReplicaAndLadder = 2


class DeviceConnectionType(enum.Enum):
    """When a device attaches (accepted; emulated devices attach at once)."""
    Always = 0
    OnDemand = 1
    Never = 2


class DeviceSelectionCriterion(enum.Enum):
    """Which free device to take (accepted; every emulated device is free)."""
    First = 0
    Random = 1


def _positive(value, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"DeviceManager: {what} must be a positive int, got {value!r}")
    return value


def _ipus_of(opts: Optional[Mapping], what: str) -> int:
    """numIPUs of a device-options dict (upstream's default 1)."""
    return _positive(int((opts or {}).get("numIPUs", 1)), f"{what} numIPUs")


class DeviceManager:
    """Upstream's `popart.DeviceManager`: hands out devices. Here every device is emulated, so
    acquiring never waits and never fails; the sync pattern, connection type and selection
    criterion are accepted as upstream takes them."""

    def acquireAvailableDevice(self, numIpus: int = 1, tilesPerIpu: int = 0,
                               pattern: SyncPattern = SyncPattern.Full,
                               connectionType: DeviceConnectionType = DeviceConnectionType.Always,
                               selectionCriterion: DeviceSelectionCriterion =
                               DeviceSelectionCriterion.First) -> DeviceInfo:
        return DeviceInfo("ipu_hw", _positive(numIpus, "numIpus"), tiles=tilesPerIpu)

    tryAcquireAvailableDevice = acquireAvailableDevice

    def acquireDeviceById(self, id: int, pattern: SyncPattern = SyncPattern.Full,  # noqa: A002
                          connectionType: DeviceConnectionType = DeviceConnectionType.Always
                          ) -> DeviceInfo:
        return DeviceInfo("ipu_hw", 1, id=id)

    tryAcquireDeviceById = acquireDeviceById

    def createCpuDevice(self) -> DeviceInfo:
        return DeviceInfo("cpu", 1)

    def createIpuModelDevice(self, opts: Optional[Mapping] = None) -> DeviceInfo:
        return DeviceInfo("ipu_model", _ipus_of(opts, "createIpuModelDevice"),
                          tiles=int((opts or {}).get("tilesPerIPU", 0) or 0))

    createSimDevice = createIpuModelDevice

    def enumerateDevices(self, pattern: SyncPattern = SyncPattern.Full, numIpus: int = 1,
                         deviceType: DeviceType = DeviceType.Ipu,
                         connectionType: DeviceConnectionType = DeviceConnectionType.Always,
                         tilesPerIPU: int = 0) -> List[DeviceInfo]:
        """One emulated device of `numIpus` IPUs (there is always one free)."""
        return [DeviceInfo("ipu_hw", _positive(numIpus, "numIpus"), tiles=tilesPerIPU)]

    def setOnDemandAttachTimeout(self, attachTimeout: int) -> None:
        """Accepted (emulated devices attach at once)."""
