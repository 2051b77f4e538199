"""The emulator's `popart`: version, exceptions (what popxl raises for upstream's PopART errors
is catchable as `popart.popart_exception`), SessionOptions as the Ir's options object, enums and
the small value classes."""
import numpy as np
import pytest

import popart
import popxl
import popxl.ops as ops


def test_version():
    assert popart.versionString() == "3.4.0"
    v = popart.versionNumber()
    assert (v.major, v.minor, v.point) == (3, 4, 0)
    assert isinstance(popart.packageHash(), str)


def test_exception_hierarchy():
    assert issubclass(popart.popart_internal_exception, popart.popart_exception)
    assert issubclass(popart.OutOfMemoryException, popart.popart_exception)
    assert issubclass(popart.poplar_unrecoverable_runtime_error, popart.poplar_runtime_error)
    e = popart.OutOfMemoryException("no tiles")
    assert e.getSummaryReport() == "no tiles" and e.getProfilePath() == ""
    assert popxl.errors.popart_exception is popart.popart_exception


def test_autodiff_of_modifying_op_raises_popart_exception_with_upstream_wording():
    ir = popxl.Ir()
    with ir.main_graph:
        def fn(x):
            ops.var_updates.accumulate_(x, x)
            return x * 2.0
        g = ir.create_graph(fn, popxl.TensorSpec((2,), popxl.float32))
    with pytest.raises(popart.popart_exception,
                       match=rf"^The graph {g.id.replace('(', '[(]').replace(')', '[)]')} "
                             r"contains a modifying op: .*Autodiff cannot be used on graphs "
                             r"with inplace modifying ops\."):
        popxl.transforms.autodiff(g)


def test_missing_required_gradient_is_a_popart_exception():
    ir = popxl.Ir()
    with ir.main_graph:
        g = ir.create_graph(lambda x, i: x * 2.0, popxl.TensorSpec((2,), popxl.float32),
                            popxl.TensorSpec((2,), popxl.int32))
    with pytest.raises(popart.popart_exception,
                       match=r"^\[Autodiff\] Unable to provide required gradient output for "
                             r"fwd id '.*/i'"):
        popxl.transforms.autodiff(g)


def test_runtime_failures_are_popart_exceptions():
    ir = popxl.Ir()
    with ir.main_graph:
        buf = popxl.remote_buffer((2,), popxl.float32, 2)
        s = popxl.h2d_stream((), popxl.int32, "off")
        ops.remote_load(buf, ops.host_load(s, "off"))
    with popxl.Session(ir, "ipu_hw") as sess:
        with pytest.raises(popart.popart_exception, match="outside remote buffer"):
            sess.run({s: np.int32(5)})


def test_session_options_are_the_irs_and_reject_unknown_options():
    ir = popxl.Ir(replication=2)
    opts = ir._pb_ir.getSessionOptions()
    assert isinstance(opts, popart.SessionOptions)
    assert opts is ir._pb_ir.getSessionOptions()
    assert opts.virtualGraphMode == popart.VirtualGraphMode.Manual
    assert opts.enableExplicitMainLoops and opts.useHostCopyOps and opts.decomposeGradSum
    assert not opts.enableVariablesCaching
    assert (opts.replicatedGraphCount, opts.enableReplicatedGraphs) == (2, True)
    ir.replication_factor = 4
    assert opts.replicatedGraphCount == 4
    opts.numIOTiles = 32
    assert ir._pb_ir.getSessionOptions().numIOTiles == 32
    with pytest.raises(AttributeError):
        opts.numIoTiles = 32                         # a typo, as upstream's pybind class
    assert popart.SessionOptions().numIOTiles == 0


def test_enums_and_value_classes():
    assert popart.RecomputationType.Standard.name == "Standard"
    assert popart.SyntheticDataMode.RandomNormal != popart.SyntheticDataMode.Zeros
    loc = popart.TensorLocation(popart.TensorStorage.OffChip,
                                popart.ReplicatedTensorSharding.On)
    settings = popart.TensorLocationSettings(loc, minElementsForOffChip=0)
    assert settings.location == loc and settings.minElementsForReplicatedTensorSharding == 8192
    with pytest.raises(TypeError, match="TensorStorage"):
        popart.TensorLocation("OffChip")
    ov = popart.OptimizerValue(0.1, False)
    assert (ov.val(), ov.isConst()) == (pytest.approx(0.1), False)
    assert popart.OptimizerValue() == popart.OptimizerValue(0.0, True)
    # popxl's classes that PopART also exports are the same objects
    assert popart.TileSet is popxl.TileSet and popart.ExecutionContext is popxl.ExecutionContext
    assert popart.CommGroup is ops.collectives.CommGroup
    with pytest.raises(AttributeError, match="no attribute 'Builder'"):
        popart.Builder


def test_device_info():
    d = popart.DeviceInfo("ipu_hw", 2)
    assert d.numIpus == 2 and d.type == popart.DeviceType.Ipu and not d.isAttached
    assert d.attach() and d.isAttached
    with pytest.raises(ValueError, match="device type"):
        popart.DeviceInfo("gpu")
    ir = popxl.Ir()
    with ir.main_graph:
        popxl.variable(1.0)
    sess = popxl.Session(ir, popart.DeviceInfo("ipu_model"))
    assert sess.device == "ipu_model"
    sess._set_device(d)
    assert sess.device == "ipu_hw"
    sess.device = popart.DeviceManager().createCpuDevice()     # assigning switches it too
    assert sess.device == "cpu" and d.tryAttachUntilTimeout() and d.isAttached


def test_device_manager_hands_out_emulated_devices():
    """Upstream's DeviceManager as test helpers use it: every kind of device is the emulator,
    so acquiring never fails; the devices run Sessions and detach on leaving `with`."""
    dm = popart.DeviceManager()
    hw = dm.acquireAvailableDevice(numIpus=2, tilesPerIpu=4, pattern=popart.SyncPattern.Full,
                                   connectionType=popart.DeviceConnectionType.OnDemand,
                                   selectionCriterion=popart.DeviceSelectionCriterion.Random)
    assert hw.type == popart.DeviceType.Ipu and hw.numIpus == 2 and hw.tilesPerIPU == 4
    model = dm.createIpuModelDevice({"numIPUs": 4, "tilesPerIPU": 8, "ipuVersion": "ipu2"})
    assert model.type == popart.DeviceType.IpuModel and model.numIpus == 4
    assert dm.createCpuDevice().type == popart.DeviceType.Cpu
    assert [d.numIpus for d in dm.enumerateDevices(numIpus=8)] == [8]
    assert dm.acquireDeviceById(3).id == 3
    dm.setOnDemandAttachTimeout(900)
    with pytest.raises(ValueError, match="numIpus must be a positive int, got 0"):
        dm.acquireAvailableDevice(numIpus=0)
    ir = popxl.Ir()
    with ir.main_graph:
        v = popxl.variable(np.float32(2), name="v")
        ops.var_updates.accumulate_(v, popxl.constant(np.float32(1)))
    with hw as device:
        device.attach()
        with popxl.Session(ir, device) as sess:
            sess.run()
            assert sess.device == "ipu_hw" and sess.get_tensor_data(v) == 3.0
    assert not hw.isAttached


def test_popart_logger_writes_to_stderr_at_warn(capfd, tmp_path, monkeypatch):
    """popart.getLogger: its own sink (stderr, not Python logging), WARN by default, upstream's
    line format; setLevel; POPART_LOG_DEST names a file."""
    import re

    log = popart.getLogger()
    log.info("not shown")
    log.warn("shown")
    err = capfd.readouterr().err
    assert "not shown" not in err
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z popart \d+\.\d+ W: shown\n", err)
    log.setLevel("DEBUG")
    try:
        popart.getLogger("session").debug("now shown")
        assert re.search(r" popart:session \d+\.\d+ D: now shown$", capfd.readouterr().err)
        monkeypatch.setenv("POPART_LOG_DEST", str(tmp_path / "popart.log"))
        log.error("to the file")
        assert capfd.readouterr().err == ""
        assert (tmp_path / "popart.log").read_text().endswith(" E: to the file\n")
        with pytest.raises(ValueError, match="unknown level 'LOUD'"):
            log.setLevel("LOUD")
    finally:
        log.setLevel("WARN")


def test_weights_io_through_pb_session():
    ir = popxl.Ir()
    with ir.main_graph:
        w = popxl.variable(np.zeros(3, np.float32), name="w")
        ops.var_updates.accumulate_(w, popxl.constant(np.ones(3, np.float32)))
    with popxl.Session(ir, "ipu_hw") as sess:
        sess._pb_session.writeWeights(popart.PyWeightsIO({w.id: np.full(3, 5, np.float32)}))
        sess._pb_session.weightsFromHost()
        sess.run()
        sess._pb_session.weightsToHost()
        out = {w.id: np.empty(3, np.float32)}
        sess._pb_session.readWeights(popart.PyWeightsIO(out))
    np.testing.assert_array_equal(out[w.id], 6)
    with pytest.raises(TypeError, match="PyWeightsIO"):
        popart.PyWeightsIO({w: np.zeros(3)})


def test_onnx_sessions_import_and_refuse_construction():
    """Programs that import PopART's ONNX sessions load; constructing one says what runs
    instead."""
    from popart import InferenceSession, TrainingSession  # noqa: F401
    for cls in (popart.InferenceSession, popart.TrainingSession):
        with pytest.raises(NotImplementedError, match="popxl.Session"):
            cls(fnModel=b"", dataFlow=None, deviceInfo=None)
        with pytest.raises(NotImplementedError, match="not emulated"):
            cls.createFromOnnxModel(b"")
    assert popart.DataType.FLOAT16 == "FLOAT16"


@pytest.mark.parametrize("env", [{"POPXL_CACHE_DIR": "/c/x"}, {"POPART_CACHE_DIR": "/c/x"},
                                 {"POPART_CACHE_DIR": "/c/y", "POPXL_CACHE_DIR": "/c/x"}])
def test_cache_dir_environment_turns_engine_caching_on(monkeypatch, env):
    """As upstream's SessionOptions: POPART_CACHE_DIR / POPXL_CACHE_DIR set engine caching
    and its path (POPXL's wins)."""
    for k in ("POPART_CACHE_DIR", "POPXL_CACHE_DIR"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    opts = popxl.Ir()._pb_ir.getSessionOptions()
    assert opts.enableEngineCaching and opts.cachePath == "/c/x"
    monkeypatch.delenv("POPART_CACHE_DIR", raising=False)
    monkeypatch.delenv("POPXL_CACHE_DIR", raising=False)
    assert not popart.SessionOptions().enableEngineCaching
