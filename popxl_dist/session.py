"""`popxl.Session`: compile an Ir once, attach, stream data in and out, read and write weights."""
from __future__ import annotations

import itertools
import logging
import numbers
import weakref
from typing import Dict, Iterable, Mapping, Optional, Set, Tuple, Union

import numpy as np
from popart import getLogger

from ._ir.debug import DebugOptions
from ._ir.records import TensorKind
from .dtypes import FLOAT8_DTYPES, host_view, storage_numpy, storage_view
from .remote_buffer import check_variables_fit_buffers
from .runtime import create_runtime
from .session_checks import (as_stream_mapping, check_compilable_dtypes, check_op_setups,
                             check_output_array, checked_downcast, number_as, read_only,
                             session_failed, variable_data_array)
from .streams import DeviceToHostStream, HostToDeviceStream
from .tensor import Constant, HostScalarTensor, Variable
from .transforms.patterns import check_op_to_identity_applied
from .transforms.replica_consistency import warn_divergences
from .utils import _DOWNCAST, to_numpy

__all__ = ["Session", "d2hStreamBufferMaps", "h2dStreamBufferMaps", "StreamBufferMaps"]

d2hStreamBufferMaps = Mapping[DeviceToHostStream, np.ndarray]
h2dStreamBufferMaps = Mapping[HostToDeviceStream, HostScalarTensor]
StreamBufferMaps = Union[h2dStreamBufferMaps, d2hStreamBufferMaps]

_log = logging.getLogger("popxl")
_SESSION_COUNT = itertools.count()      # names Sessions in debugging bundles and dumps
_DEVICES = ("ipu_hw", "ipu_model", "cpu")
_announced = False

_DETACHED_MSG = ("Must be attached to device before calling a runtime function. Try using "
                 "`with session:`.")


def _announce(device: str, backend: str, replicas: int, workers: int) -> None:
    global _announced
    if not _announced:
        _log.info("popxl-dist: device '%s' is emulated on NumPy (backend %s, %d replica(s) on "
                  "%d worker(s))", device, backend, replicas, workers)
        _announced = True


def _device_name(device) -> str:
    """The device name of `device_desc` (a `popart.DeviceInfo` gives its type's name)."""
    from popart import DeviceInfo

    if isinstance(device, DeviceInfo):
        device = device._desc
    if not isinstance(device, str) or device not in _DEVICES:
        raise ValueError(f"Session: device_desc must be one of {_DEVICES} or a popart.DeviceInfo, "
                         f"got {device!r}")
    return device


def _initial_host_value(info, n_replicas: int) -> np.ndarray:
    """A variable's host buffer before the first sync, in its `shape_on_host` layout: the initial
    data, expanded to one value per replica for `all_replicas` retrieval with group_size > 1.
    The IR's own array is shared, not copied: host buffers are replaced, never written in place
    (memmaps aside), and `get_tensor_data` returns read-only views."""
    if isinstance(info.data, np.memmap):
        return info.data            # shared, not copied (write_weights accepts the group layout)
    rg = info.extra.get("replica_grouping")
    group_size = n_replicas if rg is None else rg.group_size
    if info.extra.get("retrieval_mode") != "all_replicas" or group_size == 1:
        return info.data
    if rg is not None and rg.num_groups > 1:
        return np.ascontiguousarray(info.data[rg.assignment])
    return np.repeat(info.data[np.newaxis], n_replicas, axis=0)


class Session:
    """Runs an Ir. Every device name is the emulator; replication is allowed on all of them.

    Args:
        ir: the program; it must not be modified afterwards.
        device_desc: "ipu_hw", "ipu_model", "cpu" or a `popart.DeviceInfo`.
        weights_to_host_on_exit: copy weights back to the host when leaving `with session:`.

    Example:
        >>> with popxl.Session(ir, "ipu_hw") as session:
        ...     outputs = session.run({x_stream: x_data})
    """

    def __init__(self, ir, device_desc: str = "cpu", weights_to_host_on_exit: bool = True):
        from .ir import Ir

        if not isinstance(ir, Ir):
            raise TypeError(f"Session: `ir` must be a popxl.Ir, got {type(ir).__name__}")
        device_desc = _device_name(device_desc)
        self._ir = ir
        self.ir_ = ir              # upstream keeps this public alias too
        self._device_desc = device_desc
        # As upstream: a read-only memmap variable cannot take weights back on exit.
        self.weights_to_host_on_exit = weights_to_host_on_exit and not ir._has_read_only_memmap
        if weights_to_host_on_exit and ir._has_read_only_memmap:
            _log.info("Weights to host has been disabled as the ir contains a read-only "
                      "memmapped variable.")
        _ = ir.replication_factor      # adopts replicatedGraphCount set in the SessionOptions
        check_variables_fit_buffers(ir._data)
        check_op_to_identity_applied(ir._data)
        check_compilable_dtypes(ir._data)
        check_op_setups(ir._data)
        ir._prepared = True
        data = ir._data
        data.floating_point_checks = bool(ir._session_opts().enableFloatingPointChecks)
        data.log2_scale_checks = bool(ir._session_opts().throwIfLog2ScaleTensorNotInRange)
        data.debug = DebugOptions.from_env(data.floating_point_checks,
                                           f"session{next(_SESSION_COUNT)}")
        report = warn_divergences(data)
        if report.scratch:
            data.debug = data.debug.with_(scratch_variables=report.scratch)
        main = data.main
        self._variables = {t: i for t, i in main.tensors.items() if i.kind == TensorKind.VARIABLE}
        self._host_weights: Dict[str, np.ndarray] = {
            t: _initial_host_value(i, data.replication_factor)
            for t, i in self._variables.items()}
        self._runtime = create_runtime(data)
        weakref.finalize(self, self._runtime.close)
        _announce(device_desc, self._runtime.name, data.replication_factor,
                  self._runtime.num_workers)
        self._h2d = [ir._streams[s] for s in self._runtime.h2d_streams]
        self._d2h = [ir._streams[s] for s in self._runtime.d2h_streams]
        self._h2d_slot = {s: i for i, s in enumerate(self._h2d)}
        self._expected: Set[HostToDeviceStream] = set(self._h2d)
        self._n_transfers = ir.num_host_transfers
        self._n_replicas = ir.instance_replication_factor
        self._extra_dims = tuple(d for d in (self._n_transfers, self._n_replicas) if d > 1)
        self._attached = False
        self._depth_attached: list = []
        self._out_of_sync = False
        self._last_copy_plan = None
        # The first failure of a device operation: until `reset()` every device operation
        # raises SessionFailed (the replicas may be out of step).
        self._failure: Optional[BaseException] = None
        # Leaving `with session:` by an exception skips weights_to_host (as upstream); the
        # newer weights stay on the device and are read from there when next needed.
        self._kept_on_device = False

    # --- properties --------------------------------------------------------------------
    @property
    def ir(self):
        return self._ir

    @property
    def is_attached(self) -> bool:
        return self._attached

    @property
    def device(self) -> str:
        return self._device_desc

    @device.setter
    def device(self, device) -> None:
        """Run on another device (a name or a `popart.DeviceInfo`): all are the emulator."""
        self._set_device(device)

    @property
    def _pb_session(self):
        """Upstream's PopART session object: weight I/O by tensor id (see `_pb_shim`)."""
        from ._pb_shim import PbSession

        return PbSession(self)

    def _set_device(self, device) -> None:
        """Use another device (a name or `popart.DeviceInfo`: all are the emulator)."""
        if self._attached:
            raise RuntimeError("Session._set_device: detach the session first")
        self._device_desc = _device_name(device)

    # --- attach / detach ---------------------------------------------------------------
    def __enter__(self) -> "Session":
        was = self._attached
        self._depth_attached.append(was)
        if not was:
            self._attach()
            if self._kept_on_device:
                # The device holds newer weights than the host (see __exit__): keep them.
                self._kept_on_device = False
                self._out_of_sync = True
            elif self._failure is None:
                self.weights_from_host()
        return self

    def __exit__(self, exc_type, exc_value, exc_tb) -> None:
        """Detach; copy the weights to the host first, unless an exception is leaving the
        context or the Session failed. Then (a popxl-dist deviation that loses no training)
        the weights stay on the device: `get_tensor_data` and `write_variable_data` read them
        from there and the next `with session:` keeps them instead of uploading the stale host
        copy."""
        was = self._depth_attached.pop()
        if not was and self._attached:
            try:
                if exc_type is None and self._failure is None:
                    if self.weights_to_host_on_exit:
                        self.weights_to_host()
                elif self._out_of_sync:
                    self._kept_on_device = True
            finally:
                self._detach()

    def _attach(self) -> None:
        self._runtime.attach()
        self._attached = True

    def _detach(self) -> None:
        self._runtime.detach()
        self._attached = False

    def _require_attached(self) -> None:
        if not self._attached:
            raise ValueError(_DETACHED_MSG)

    # --- host I/O shapes ---------------------------------------------------------------
    def _extra_input_dims(self) -> Tuple[int, ...]:
        return self._extra_dims

    def _full_input_shape(self, shape: Tuple[int, ...]) -> Tuple[int, ...]:
        return self._extra_dims + tuple(shape)

    def expected_inputs(self) -> Set[HostToDeviceStream]:
        return set(self._expected)

    def create_host_outputs(self) -> Dict[DeviceToHostStream, np.ndarray]:
        out = {}
        for s in self._d2h:
            shape = self._full_input_shape(s.shape)
            try:
                out[s] = np.empty(shape, s.dtype.as_numpy())
            except MemoryError as e:
                raise MemoryError(f"Session: the host buffer of d2h_stream '{s.tensor_id}' "
                                  f"(shape {shape}, {s.dtype.name}) cannot be allocated: "
                                  f"{e}") from None
        return out

    def _as_transfers(self, stream, arr: np.ndarray, is_input: bool) -> np.ndarray:
        """Check `arr` against the stream and view it as `(T, R, *shape)`."""
        shape = stream.shape
        n, r = self._n_transfers, self._n_replicas
        full = self._extra_dims + shape
        kind = "input" if is_input else "output"
        if arr.shape == full:
            t = n
        elif n > 1 and arr.ndim == len(full) and arr.shape[0] >= n and arr.shape[1:] == full[1:]:
            t = arr.shape[0]
        elif arr.size == int(np.prod(full)) and np.squeeze(arr).shape == tuple(
                d for d in full if d != 1):
            t = n
        else:
            raise ValueError(
                f"Session.run: {kind} stream '{stream.tensor_id}' expects an array of shape "
                f"{full} (num_host_transfers={n}, replicas={r}"
                f"{' of this popdist instance' if self._ir._data.instance else ''}, "
                f"stream shape {shape}), "
                f"got shape {arr.shape}")
        return arr.reshape((t, r) + shape)

    def _convert_input(self, stream, value, downcast: bool) -> np.ndarray:
        try:
            arr = value if type(value) is np.ndarray else to_numpy(value, downcast=False,
                                                                   copy=False)
        except Exception as e:  # noqa: BLE001
            raise TypeError(f"Session.run: input for stream '{stream.tensor_id}' cannot be "
                            f"converted to a NumPy array: {e}") from e
        want = storage_numpy(stream.dtype)
        if arr.dtype != want and arr.dtype == stream.dtype.as_numpy():
            arr = arr.view(want).reshape(arr.shape)     # float8 structured data: its codes
        if downcast and arr.dtype != want and _DOWNCAST.get(arr.dtype) == want:
            arr = checked_downcast(stream.tensor_id, arr, want)
        if arr.dtype != want:
            hint = (f"cast it with popxl.fp8_utils.host_pow2scale_cast_to_fp8(data, "
                    f"popxl.{stream.dtype.name}, log2_scale)"
                    if stream.dtype in FLOAT8_DTYPES else
                    f"convert the data, e.g. arr.astype(np.{want.name})")
            raise TypeError(
                f"Session.run: input stream '{stream.tensor_id}' expects dtype "
                f"{stream.dtype.name}, got {arr.dtype} ({hint})")
        return self._as_transfers(stream, arr, True)

    # --- running -----------------------------------------------------------------------
    def run(self, inputs: Optional[Mapping[HostToDeviceStream, np.ndarray]] = None,
            downcast_inputs: bool = True) -> Dict[DeviceToHostStream, np.ndarray]:
        """Run the program once; returns `{d2h_stream: array}` in upstream's host layout."""
        self._require_attached()
        inputs = as_stream_mapping(inputs, "Session.run", "input")
        outputs = self.create_host_outputs()
        self.run_with_outputs(inputs, outputs, downcast_inputs)
        return outputs

    def run_with_outputs(self, inputs: Optional[Mapping[HostToDeviceStream, np.ndarray]] = None,
                         outputs: Optional[Mapping[DeviceToHostStream, np.ndarray]] = None,
                         downcast_inputs: bool = True) -> None:
        """Run once, writing into the caller's `outputs` arrays. Every argument is checked
        before anything runs; a run that fails marks the Session failed (see `reset`)."""
        self._require_attached()
        inputs = as_stream_mapping(inputs, "Session.run_with_outputs", "input")
        outputs = as_stream_mapping(outputs, "Session.run_with_outputs", "output")
        self._validate_run_inputs(inputs)
        self._validate_run_outputs(outputs)
        in_arrays = [self._convert_input(s, inputs[s], downcast_inputs) for s in self._h2d]
        out_arrays = []
        for s in self._d2h:
            o = outputs[s]
            check_output_array(s.tensor_id, o, s.dtype.as_numpy(), s.dtype.name)
            out_arrays.append(self._as_transfers(s, storage_view(o, s.dtype), False))
        self._out_of_sync = True
        self._on_device("Session.run", self._runtime.run, in_arrays, out_arrays)

    def _on_device(self, what: str, fn, *args):
        """Call a runtime operation that changes the device. The first one to fail marks the
        Session failed; while failed, every such call raises SessionFailed naming it."""
        if self._failure is not None:
            raise session_failed(what, self._failure) from self._failure
        try:
            return fn(*args)
        except BaseException as e:
            self._failure = e
            if what == "Session.run" and self._ir._data.debug.record_dir:
                self._complete_recording()
            raise

    def _complete_recording(self) -> None:
        """After a failed run (POPXL_RECORD): every worker that can still answer writes its
        part of the run's bundle (those whose part of the run failed already did)."""
        try:
            self._runtime.save_recording()
        except Exception:  # noqa: BLE001 - the run's failure is what the caller must see
            pass

    def reset(self) -> None:
        """popxl-dist extension: clear a failed state (after a run or weight transfer failed,
        every device operation raises SessionFailed) by restoring every replica from the host
        weights: the values last copied to the host (by `weights_to_host`, `get_tensor_data`
        or `write_variable_data`). When detached, the next `with session:` uploads them. Raises
        again if the workers cannot be reached (e.g. one died: create a new Session)."""
        self._failure = None
        self._kept_on_device = False
        self._out_of_sync = False
        if self._attached:
            self.weights_from_host()

    def _expected_outputs(self) -> Set[DeviceToHostStream]:
        """The d2h streams the program writes (every stream with a host_store)."""
        return set(self._d2h)

    def _validate_run_inputs(self, inputs: Mapping) -> None:
        """Raise ValueError unless `inputs` has exactly the expected h2d streams."""
        if inputs.keys() != self._expected:
            self._stream_key_error("input", set(inputs), self._expected)

    def _validate_run_outputs(self, outputs: Mapping) -> None:
        """Raise ValueError unless `outputs` has exactly the program's d2h streams."""
        expected = self._expected_outputs()
        if outputs.keys() != expected:
            self._stream_key_error("output", set(outputs), expected)

    @staticmethod
    def _stream_key_error(kind: str, got: Set, want: Set) -> None:
        unexpected = [s.tensor_id if hasattr(s, "tensor_id") else repr(s) for s in got - want]
        missing = [s.tensor_id for s in want - got]
        raise ValueError(f"Session.run: the {kind} streams do not match the program. "
                         f"Unexpected: {sorted(unexpected)}. Missing: {sorted(missing)}.")

    # --- weights -----------------------------------------------------------------------
    def weights_to_host(self) -> None:
        """Copy every variable from the device into the host buffers.

        Raises:
            RuntimeError: the Ir has a variable over a read-only memmap (as upstream; its
                host copy is the read-only file).
        """
        self._check_no_read_only_memmap("Session.weights_to_host")
        self._require_attached()
        self._sync_to_host("Session.weights_to_host")

    def _check_no_read_only_memmap(self, what: str) -> None:
        if self._ir._has_read_only_memmap:
            names = [t for t, i in self._variables.items()
                     if isinstance(i.data, np.memmap) and not i.data.flags.writeable]
            raise RuntimeError(f"{what}: writing data from device to host is not possible as the "
                               f"ir contains a read-only memmap (variables {names})")

    def _sync_to_host(self, what: str) -> None:
        """Read every variable from the device into the host copy. Host buffers are replaced,
        not overwritten (except memmaps: the file is the host copy), so arrays returned by
        `get_tensor_data` earlier keep their values."""
        log = getLogger("devicex")      # PopART's log lines for the copy, as upstream
        log.debug("Writing weights to host")
        values = self._on_device(what, self._read_device_weights)
        for tid, value in values.items():
            buf = self._host_weights[tid]
            if isinstance(buf, np.memmap) and not buf.flags.writeable:
                # A read-only file keeps being the host value while the device agrees with it.
                if not np.array_equal(buf, value):
                    self._host_weights[tid] = value
            elif isinstance(buf, np.memmap) and buf.shape == value.shape:
                buf[...] = value
                buf.flush()
            else:
                self._host_weights[tid] = value
        self._out_of_sync = False
        self._kept_on_device = False
        log.debug("Writing weights to host complete.")

    def _read_device_weights(self) -> Dict[str, np.ndarray]:
        self._runtime.run_fragment("weights_to_host")
        return self._runtime.read_variables(list(self._variables))

    def weights_from_host(self) -> None:
        """Copy every host weight to the device."""
        self._require_attached()
        log = getLogger("devicex")      # PopART's log lines for the copy, as upstream
        log.debug("Writing weights from host, ")
        self._on_device("Session.weights_from_host", self._upload_weights, self._host_weights)
        self._out_of_sync = False
        log.debug("done.")

    def _upload_weights(self, values: Dict[str, np.ndarray], fragment: bool = True) -> None:
        self._runtime.write_variables(values)
        if fragment:
            self._runtime.run_fragment("weights_from_host")

    def _check_tensor(self, t) -> None:
        if not isinstance(t, (Variable, Constant)):
            raise TypeError(f"{t} is not of type Constant or Variable. get_tensor_data is not "
                            f"supported for this type. (Stream it out with ops.host_store.)")
        if t.ir is not self._ir:
            raise ValueError(f"get_tensor_data: tensor '{t.id}' belongs to another Ir")

    def get_tensor_data(self, tensor) -> np.ndarray:
        """The host value of a Variable (synced from the device first if needed) or Constant.

        Deviation from upstream (which returns a view of its host buffer, so the array changes
        at the next sync and writing into it changes what the next attach uploads): the result
        is a read-only snapshot. It never changes afterwards, and writing into it raises;
        `.copy()` it to modify it. (A variable backed by an np.memmap returns the memmap itself,
        as upstream: the file is the host copy the user chose to share, which later syncs
        update.)"""
        return self.get_tensors_data([tensor])[tensor]

    def get_tensors_data(self, tensors: Iterable) -> Dict:
        """`{tensor: get_tensor_data(tensor)}`, syncing from the device at most once."""
        tensors = list(tensors)
        for t in tensors:
            self._check_tensor(t)
        if self._device_is_newer() and any(isinstance(t, Variable) for t in tensors):
            self._check_no_read_only_memmap("get_tensor_data")     # as upstream
            self._sync_to_host("get_tensor_data")
        return {t: read_only(host_view(self._host_weights[t.id] if isinstance(t, Variable)
                                       else t._info.data, t.dtype))
                for t in tensors}

    def _device_is_newer(self) -> bool:
        """Whether the device holds newer weights than the host copy that a read must fetch:
        after a run while attached (as upstream), or after leaving `with session:` by an
        exception (which skipped the copy to the host)."""
        return self._kept_on_device or (self._attached and self._out_of_sync)

    def write_variable_data(self, tensor, data) -> None:
        self.write_variables_data({tensor: data})

    def write_variables_data(self, tensors: Mapping) -> None:
        """Write host data into variables (and to the device when attached)."""
        updates = self._write_host_weights(tensors)
        if self._attached:
            # RTS shards on the device are loaded from their buffers by the fragment.
            sharded = any(self._variables[t].extra.get("sharded") for t in updates)
            self._on_device("write_variable_data", self._upload_weights,
                            {t: self._host_weights[t] for t in updates}, sharded)

    def _write_host_weights(self, tensors: Mapping) -> list:
        """Check `{variable: data}` and store it in the host buffers (after syncing them from
        the device if they are stale); returns the ids written."""
        updates = {}
        for v, data in tensors.items():
            if not isinstance(v, Variable):
                raise TypeError(f"Tensor {getattr(v, 'id', v)} is not of type Variable. "
                                f"write_variable_data is not supported for this type.")
            if v.ir is not self._ir:
                raise ValueError(f"write_variable_data: variable '{v.id}' belongs to another Ir")
            if v.retrieval_mode == "all_replicas" and v.replica_grouping.group_size > 1:
                raise NotImplementedError(f"write_variable_data: variable '{v.id}' has "
                                          f"retrieval_mode 'all_replicas' with group_size > 1, "
                                          f"which cannot be written (as upstream)")
            host = self._host_weights[v.id]
            if isinstance(host, np.memmap) and not host.flags.writeable:
                raise ValueError(f"write_variable_data: variable '{v.id}' is backed by a "
                                 f"read-only memmap ({host.filename})")
            want = v.dtype.as_numpy()
            if isinstance(data, numbers.Number):
                if v.dtype in FLOAT8_DTYPES:
                    raise TypeError(f"Data for variable {v.id} must be passed in as an np.array "
                                    f"with dtype {want} (see "
                                    f"popxl.fp8_utils.host_pow2scale_cast_to_fp8)")
                arr = np.full(v.shape_on_host, number_as(v.id, data, want), dtype=want)
            else:
                arr = variable_data_array(v.id, data, v.shape_on_host, want)
                if arr.dtype != want:
                    raise TypeError(
                        f"The dtype of the input array {arr.dtype} must match the equivalent "
                        f"type of the tensor {v.id} : {v.dtype}"
                        + (f" (float8 data: host_pow2scale_cast_to_fp8(x, popxl.{v.dtype.name},"
                           f" log2_scale), or codes.view({want}) for uint8 codes)"
                           if v.dtype in FLOAT8_DTYPES else ""))
                arr = storage_view(arr, v.dtype)
            if arr.shape != tuple(v.shape_on_host):
                host = tuple(v.shape_on_host)
                raise ValueError(
                    f"The shape of the input array {arr.shape} must match the shape of the "
                    f"tensor {v.id} : {v.shape}"
                    + (f" (its host data has shape {host}: a leading axis for the replica "
                       f"groups or replicas)" if host != tuple(v.shape) else ""))
            updates[v.id] = arr
        if self._device_is_newer():
            self._sync_to_host("write_variable_data")
        for tid, arr in updates.items():
            buf = self._host_weights[tid]
            if isinstance(buf, np.memmap):
                buf[...] = arr
            else:       # a new buffer: earlier get_tensor_data results keep their values
                self._host_weights[tid] = np.array(arr, copy=True)
        return list(updates)

    def copy_weights_to(self, other: "Session", mapping: Mapping[Variable, Variable]) -> None:
        """popxl-dist extension (upstream has no such method): copy variables of this Session
        into variables of `other`, e.g. trained weights into a test program.

        The result equals `other.write_variables_data({d: self.get_tensor_data(s)})` for every
        `s: d` of `mapping`. When both Sessions are attached and their replicas live on the same
        workers (same backend and worker pool), the copy runs on the workers and no array
        crosses the host; each destination replica takes the value of a source replica of the
        same group on its own worker (the same replica index when there is one), and RTS
        variables are copied shard by shard. Pairs that cannot be copied there (a detached
        Session, different workers, sharded on one side only, or a destination replica whose
        worker holds no source replica of its group) go through the host.

        Args:
            other: the destination Session (may be this one).
            mapping: `{source variable of this Session: destination variable of other}`. Each
                pair must agree in dtype, shape and host layout (number of groups, retrieval
                mode).
        """
        pairs = self._copy_pairs(other, mapping)
        if not pairs:
            return
        via_host = pairs
        # Within one Session a variable both read and written by the copy (e.g. a swap) needs
        # every source read first: the host path does that.
        overlaps = other is self and {s.id for s, _ in pairs} & {d.id for _, d in pairs}
        if (self._attached and other._attached and not overlaps
                and self._runtime.shares_workers_with(other._runtime)):
            plans, host_ids = self._copy_plan(other, [(s.id, d.id) for s, d in pairs])
            if any(plans):      # (a failure marks both Sessions failed)
                other._on_device("copy_weights_to", self._on_device, "copy_weights_to",
                                 self._copy_on_workers, other, plans)
            host_ids = set(host_ids)
            via_host = [(s, d) for s, d in pairs if (s.id, d.id) in host_ids]
        if via_host:
            data = self.get_tensors_data([s for s, _ in via_host])
            if other is self:         # the host buffers themselves: copy before overwriting
                data = {t: np.array(v, copy=True) for t, v in data.items()}
            other.write_variables_data({d: data[s] for s, d in via_host})

    def _copy_plan(self, other: "Session", ids: list):
        """`plan_copy` for these (source, destination) ids, kept for the next identical call
        (a job copies the same weights before every evaluation)."""
        from .runtime.backends.copy import plan_copy

        key = (weakref.ref(other._runtime), tuple(ids))
        cached = self._last_copy_plan
        if cached is not None and cached[0] == key:
            return cached[1]
        plan = plan_copy(self._ir._data, self._runtime.blocks(), other._ir._data,
                         other._runtime.blocks(), ids)
        self._last_copy_plan = (key, plan)
        return plan

    def _copy_pairs(self, other: "Session", mapping) -> list:
        """Check `copy_weights_to`'s arguments; the (source, destination) pairs."""
        what = "copy_weights_to"
        if not isinstance(other, Session):
            raise TypeError(f"{what}: `other` must be a popxl.Session, got "
                            f"{type(other).__name__}")
        if not isinstance(mapping, Mapping):
            raise TypeError(f"{what}: `mapping` must be a Mapping {{source Variable: "
                            f"destination Variable}}, got {type(mapping).__name__}")
        pairs, seen = [], {}
        for s, d in mapping.items():
            for t, sess, side in ((s, self, "source"), (d, other, "destination")):
                if not isinstance(t, Variable):
                    raise TypeError(f"{what}: every {side} must be a popxl.Variable, got {t!r}")
                if t.ir is not sess._ir:
                    raise ValueError(f"{what}: {side} variable '{t.id}' does not belong to the "
                                     f"{side} Session's Ir")
            if d.id in seen:
                raise ValueError(f"{what}: destination '{d.id}' is mapped from both "
                                 f"'{seen[d.id]}' and '{s.id}'")
            seen[d.id] = s.id
            if s.dtype != d.dtype:
                raise TypeError(f"{what}: '{s.id}' has dtype {s.dtype.name} but its destination "
                                f"'{d.id}' has dtype {d.dtype.name}")
            if s._full_shape != d._full_shape:
                raise ValueError(f"{what}: '{s.id}' has shape {s._full_shape} but its "
                                 f"destination '{d.id}' has shape {d._full_shape}")
            if d.retrieval_mode == "all_replicas" and d.replica_grouping.group_size > 1:
                raise NotImplementedError(f"{what}: destination '{d.id}' has retrieval_mode "
                                          f"'all_replicas' with group_size > 1, which cannot "
                                          f"be written (as upstream)")
            if tuple(s._retrieved_shape) != tuple(d._retrieved_shape):
                raise ValueError(
                    f"{what}: '{s.id}' ({s.replica_grouping.num_groups} group(s), retrieval "
                    f"'{s.retrieval_mode}', host shape {tuple(s._retrieved_shape)}) and "
                    f"'{d.id}' ({d.replica_grouping.num_groups} group(s), host shape "
                    f"{tuple(d._retrieved_shape)}) have different host layouts")
            pairs.append((s, d))
        return pairs

    def _copy_on_workers(self, other: "Session", plans) -> None:
        """Run a copy plan: remote and RTS variables are synced with their buffers around it
        (the WeightsToHost / WeightsFromHost fragments), as `get_tensor_data` and
        `write_variable_data` do."""
        def uses_buffers(sess, ids) -> bool:
            return any("remote" in sess._variables[t].extra for t in ids)

        src_ids = {p[0] for plan in plans for p in plan}
        dst_ids = {p[1] for plan in plans for p in plan}
        if uses_buffers(self, src_ids):
            self._runtime.run_fragment("weights_to_host")
        dst_buffers = uses_buffers(other, dst_ids)
        if dst_buffers and other is not self:
            other._runtime.run_fragment("weights_to_host")
        self._runtime.copy_to(other._runtime, plans)
        if dst_buffers:
            other._runtime.run_fragment("weights_from_host")
        other._out_of_sync = True

    def device_memory_report(self):
        """popxl-dist extension: bytes of device memory (on-chip variables, RTS shards, remote
        buffers) of the first replica of each worker, as a list of dicts. Requires attach."""
        self._require_attached()
        return self._runtime.memory_report()
