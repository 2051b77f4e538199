"""Variables over np.memmap: the memmap is the variable's host data (shared, not copied),
`get_tensor_data` returns it, `weights_to_host` writes into it (and its file), and a read-only
memmap turns off weights_to_host on exit and makes device reads raise (as upstream); memmaps
that would need a copy are refused; VariableFactory's memmap helpers (instance 0 writes)."""
from __future__ import annotations

from functools import partial

import re

import numpy as np
import pytest

import popxl
import popxl.ops as ops
import popxl_addons as addons


def _accumulating_program(data, replicas=1):
    ir = popxl.Ir(replication=replicas)
    with ir.main_graph:
        v = popxl.variable(data, popxl.float32, name="v")
        ops.var_updates.accumulate_(v, popxl.constant(np.ones(data.shape, np.float32)))
    return ir, v


def test_variable_shares_a_writable_memmap_and_weights_to_host_writes_the_file(tmp_path):
    path = tmp_path / "v.npy"
    mm = np.lib.format.open_memmap(path, "w+", np.float32, (2, 3))
    mm[...] = np.arange(6, dtype=np.float32).reshape(2, 3)
    ir, v = _accumulating_program(mm)
    assert v._memmap_arr is mm
    assert not ir._has_read_only_memmap
    session = popxl.Session(ir, "ipu_hw")
    assert session.weights_to_host_on_exit
    assert session.get_tensor_data(v) is mm
    with session:
        session.run()
        session.run()
        data = session.get_tensor_data(v)
        assert data is mm
    np.testing.assert_array_equal(mm, np.arange(6).reshape(2, 3) + 2)
    np.testing.assert_array_equal(np.load(path), np.arange(6).reshape(2, 3) + 2)
    session.write_variable_data(v, np.zeros((2, 3), np.float32))
    np.testing.assert_array_equal(np.load(path), np.zeros((2, 3)))


def test_read_only_memmap_disables_weights_to_host_on_exit(tmp_path):
    path = tmp_path / "frozen.npy"
    np.save(path, np.full((2, 2), 5.0, np.float32))
    ro = np.load(path, mmap_mode="r")
    ir = popxl.Ir()
    with ir.main_graph:
        frozen = popxl.variable(ro, name="frozen")
        trained = popxl.variable(np.zeros((2, 2), np.float32), name="trained")
        ops.var_updates.accumulate_(trained, frozen)
    assert ir._has_read_only_memmap
    session = popxl.Session(ir, "ipu_hw")
    assert not session.weights_to_host_on_exit
    with session:
        session.run()
    # No sync on exit: the host copy of the trained weight is still its initial value.
    np.testing.assert_array_equal(session.get_tensor_data(trained), np.zeros((2, 2)))
    with session:
        session.run()
        # As upstream, nothing reads the device back while a read-only memmap is in the Ir.
        with pytest.raises(RuntimeError, match="read-only memmap.*frozen"):
            session.weights_to_host()
        with pytest.raises(RuntimeError, match="read-only memmap"):
            session.get_tensors_data([frozen, trained])
    data = session.get_tensors_data([frozen, trained])      # detached: the host copies
    assert data[frozen] is ro
    np.testing.assert_array_equal(data[trained], np.zeros((2, 2)))
    with pytest.raises(ValueError, match="read-only memmap"):
        session.write_variable_data(frozen, np.zeros((2, 2), np.float32))
    assert session.weights_to_host_on_exit is False


def test_read_only_memmap_file_is_never_written(tmp_path):
    path = tmp_path / "ro.npy"
    np.save(path, np.ones(3, np.float32))
    ir, v = _accumulating_program(np.load(path, mmap_mode="r"))
    with popxl.Session(ir, "ipu_hw") as s:
        s.run()
        with pytest.raises(RuntimeError, match="read-only memmap"):
            s.get_tensor_data(v)
    np.testing.assert_array_equal(s.get_tensor_data(v), [1.0, 1.0, 1.0])
    np.testing.assert_array_equal(np.load(path), [1.0, 1.0, 1.0])


def _facts(seed):
    np.random.seed(seed)
    ir = popxl.Ir(replication=2)
    with ir.main_graph:
        facts = addons.NamedVariableFactories()
        facts.insert("w", addons.VariableFactory(partial(np.random.normal, 0, 1, (4, 2)),
                                                 popxl.float32))
        facts.insert("b", addons.VariableFactory(partial(np.random.normal, 0, 1, (4,)),
                                                 popxl.float32))
    return ir, facts


def _raw(path, like) -> np.ndarray:
    """A factory memmap file's contents: the raw array, as upstream writes it (no header)."""
    return np.fromfile(path, like.dtype).reshape(like.shape)


def test_factory_memmaps_match_plain_init_and_reopen_read_only(tmp_path):
    ir, facts = _facts(0)
    with ir.main_graph:
        mem = facts.init(memmap_dir=str(tmp_path))
    ir2, facts2 = _facts(0)
    with ir2.main_graph:
        plain = facts2.init()
    for key in ("w", "b"):
        mm = mem[key]._memmap_arr
        assert isinstance(mm, np.memmap) and mm.flags.writeable
        np.testing.assert_array_equal(_raw(tmp_path / f"{key}.npy", mm), mm)
        s1, s2 = popxl.Session(ir, "ipu_hw"), popxl.Session(ir2, "ipu_hw")
        np.testing.assert_array_equal(s1.get_tensor_data(mem[key]),
                                      s2.get_tensor_data(plain[key]))
    ir3, facts3 = _facts(1)
    with ir3.main_graph:
        again = facts3.init(memmap_dir=str(tmp_path), read_only_if_exists=True)
    assert ir3._has_read_only_memmap and not again.w._memmap_arr.flags.writeable
    np.testing.assert_array_equal(again.w._memmap_arr, mem.w._memmap_arr)


def test_only_instance_zero_writes_and_popdist_runs_meet_at_a_barrier(tmp_path, monkeypatch):
    import popdist

    calls = []
    monkeypatch.setattr(popdist, "barrier", lambda: calls.append(popdist.isPopdistEnvSet()))
    ir, facts = _facts(0)
    with ir.main_graph:
        first = facts.init(memmap_dir=str(tmp_path))       # instance 0 of a plain run
    assert calls == [False, False]                          # (a no-op outside popdist)
    monkeypatch.setattr(popdist, "isPopdistEnvSet", lambda: True)
    monkeypatch.setattr(popdist, "getInstanceIndex", lambda: 1)
    ir2, facts2 = _facts(5)                                 # other data: not written
    with ir2.main_graph:
        other = facts2.init(memmap_dir=str(tmp_path))
    assert calls[2:] == [True, True]
    np.testing.assert_array_equal(other.w._memmap_arr, first.w._memmap_arr)


def test_remote_and_rts_variables_over_memmaps(tmp_path):
    ir, facts = _facts(0)
    with ir.main_graph:
        buffers = addons.named_variable_buffers(facts, shard_over_dict={"w": True, "b": False})
        variables = facts.init_remote(buffers, memmap_dir=str(tmp_path))
        shards = addons.remote.load_remote(buffers)
        for key in ("w", "b"):
            ops.var_updates.accumulate_(shards[key], popxl.constant(
                np.ones(shards[key].shape, np.float32)))
        addons.remote.store_remote(buffers, shards)
    before = {k: np.array(variables[k]._memmap_arr) for k in ("w", "b")}
    with popxl.Session(ir, "ipu_hw") as s:
        s.run()
        data = s.get_tensors_data(variables.tensors)
    for key in ("w", "b"):
        var = variables[key]
        assert data[var] is var._memmap_arr
        np.testing.assert_array_equal(_raw(tmp_path / f"{key}.npy", before[key]),
                                      before[key] + 1)


# --- memmaps that would have to be copied (upstream's rules), for every variable kind ------
def _onchip(data, dtype=None, rg=None):
    return popxl.variable(data, dtype, name="w", replica_grouping=rg), None


def _remote(data, dtype=None, rg=None):
    shape = data.shape[1:] if rg is not None and rg.num_groups > 1 else data.shape
    buf = popxl.remote_buffer(shape, popxl.dtype.as_dtype(data.dtype))
    return popxl.remote_variable(data, buf, 0, dtype, name="w", replica_grouping=rg), buf


def _remote_rts(data, dtype=None, rg=None):
    buf = popxl.replica_sharded_buffer(data.shape, popxl.dtype.as_dtype(data.dtype), rg)
    return popxl.remote_replica_sharded_variable(data, buf, 0, dtype, name="w",
                                                 replica_grouping=rg), buf


def _rts(data, dtype=None, rg=None):
    return popxl.replica_sharded_variable(data, dtype, name="w", replica_grouping=rg)[0], None


KINDS = [_onchip, _remote, _remote_rts, _rts]


@pytest.mark.parametrize("make", KINDS, ids=lambda f: f.__name__.strip("_"))
def test_memmaps_that_need_a_copy_are_refused(tmp_path, make):
    ir = popxl.Ir(replication=2)
    f32 = np.memmap(tmp_path / "a.bin", np.float32, "w+", shape=(4,))
    fortran = np.memmap(tmp_path / "b.bin", np.float32, "w+", shape=(4, 4), order="F")
    f64 = np.memmap(tmp_path / "c.bin", np.float64, "w+", shape=(4,))
    with ir.main_graph:
        with pytest.raises(ValueError, match="memory-mapped.*`dtype` parameter must be None or "
                                             "the same"):
            make(f32, popxl.float16)
        with pytest.raises(ValueError, match="memory-mapped.*C-ordered and aligned.*Fortran"):
            make(fortran)
        for dtype in (None, popxl.float64):
            with pytest.raises(ValueError, match="memory-mapped.*requires downcasting.*float64"):
                make(f64, dtype)
        var, _ = make(f32, popxl.float32)                # the same dtype is fine: shared
        assert var._memmap_arr is f32


@pytest.mark.parametrize("make", KINDS, ids=lambda f: f.__name__.strip("_"))
def test_memmap_with_a_non_constant_grouping_is_copied(tmp_path, make, capfd):
    """Upstream lays such data out for the device's const_rg, so it copies it (with a warning
    on PopART's logger, to stderr): the variable is not memmap-backed; the program runs as with
    an array."""
    ir = popxl.Ir(replication=8)
    data = np.memmap(tmp_path / "w.bin", np.float32, "w+", shape=(2, 8))
    data[...] = np.arange(16, dtype=np.float32).reshape(2, 8)
    with ir.main_graph, popxl.in_sequence():
        rg = ir.replica_grouping_from_assignments([0, 0, 1, 1, 0, 0, 1, 1])
        capfd.readouterr()
        var, buf = make(data, rg=rg)
        err = capfd.readouterr().err
        assert re.search(r"^\d{4}-\d\d-\d\dT[\d:.]+Z popart \d+\.\d+ W: In creation of variable "
                         r".*you have passed np.memmap data and a non-const replica grouping",
                         err, re.M), err
        assert var._memmap_arr is None
        if buf is not None:
            w = ops.remote_load(buf, 0)
            if make is _remote_rts:
                const = rg.const_rg
                w = ops.collectives.replica_sharded_slice(
                    ops.collectives.replicated_all_gather(w, group=const) + 1, group=const)
            else:
                w = w + 1
            ops.remote_store(buf, 0, w)
        elif make is _onchip:
            ops.var_updates.accumulate_(var, popxl.constant(np.ones(8, np.float32)))
    with popxl.Session(ir, "ipu_hw") as sess:
        sess.run()
    got = sess.get_tensor_data(var)
    want = np.arange(16, dtype=np.float32).reshape(2, 8) + (0 if make is _rts else 1)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(data, np.arange(16).reshape(2, 8))     # the file is untouched
