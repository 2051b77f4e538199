"""`popxl_addons.TaskSession`: streams and state, steps, checkpoints in upstream's layout
(`model/<key>.npz` holding the array under `<key>`, `dataloader.bin`, `session_info.json`),
`max_checkpoints`, missing-key reports, `load_from_session`, memmap-backed variables and
instance-0-only writes."""
from __future__ import annotations

import json
import os

import numpy as np
import popxl
import popxl_addons as addons
import pytest
from popxl import ops
from popxl_addons.layers import Linear

import popdist


class Loader:
    """A dataloader with `save` / `resume` (it records its position)."""

    def __init__(self):
        self.position = 0
        self.resumed_from = None

    def save(self, path):
        with open(path, "w") as f:
            json.dump({"position": self.position}, f)

    def resume(self, path):
        self.resumed_from = path
        with open(path) as f:
            self.position = json.load(f)["position"]


def make_session(seed: int = 0, replicas: int = 1, memmap_dir=None, rts: bool = False,
                 max_checkpoints: int = 1) -> addons.TaskSession:
    """A TaskSession whose state is a Linear layer's weights plus a step counter: each run adds
    the streamed `x` to the weight (and 1 to the counter)."""
    np.random.seed(seed)
    ir = popxl.Ir(replication=replicas)
    with ir.main_graph:
        inputs = addons.InputStreams(x=((4, 3), popxl.float32))
        x = ops.host_load(inputs.x)
        facts, graph = Linear(3).create_graph(
            popxl.TensorSpec((2, 4), popxl.float32))
        variables = facts.init(memmap_dir=memmap_dir)
        counter = popxl.variable(np.zeros((), np.float32), name="counter")
        state = {"layer": variables, "counter": counter}
        if rts:
            shard_var, shard = popxl.replica_sharded_variable(
                np.arange(6, dtype=np.float32), name="sharded")
            ops.var_updates.accumulate_(shard, popxl.constant(np.ones(6 // replicas,
                                                                      np.float32)))
            state["sharded"] = shard_var
        ops.var_updates.accumulate_(variables.weight, x)
        ops.var_updates.accumulate_(counter, popxl.constant(np.float32(1)))
        out = popxl.d2h_stream((), popxl.float32, "total")
        ops.host_store(out, ops.sum(variables.weight))
    state_nt = addons.NamedTensors()
    state_nt.insert("layer", variables)
    state_nt.insert("counter", counter)
    if rts:
        state_nt.insert("sharded", state["sharded"])
    return addons.TaskSession([inputs.x], [out], state_nt, max_checkpoints, ir, "ipu_hw")


def feed(session, value: float):
    shape = session.inputs.x.shape
    R = session.ir.replication_factor
    data = np.full(((R,) if R > 1 else ()) + shape, value, np.float32)
    return session.run({session.inputs.x: data})


def test_streams_state_and_steps():
    session = make_session()
    assert isinstance(session, popxl.Session)
    assert isinstance(session.inputs, addons.InputStreams)
    assert isinstance(session.outputs, addons.OutputStreams)
    assert list(session.inputs.keys()) == ["x"] and list(session.outputs.keys()) == ["total"]
    assert session.session_state == {"steps": 0}
    with session:
        feed(session, 1.0)
        out = feed(session, 2.0)
    assert session.session_state["steps"] == 2
    data = session.get_named_tensors_data()
    assert isinstance(data, addons.NamedTensorData)
    assert sorted(data.to_dict()) == ["counter", "layer.bias", "layer.weight"]
    assert data.counter == 2.0
    np.testing.assert_allclose(out[session.outputs.total], np.sum(data.layer.weight),
                               rtol=1e-6)
    session.add_session_state_info({"epoch": 3})
    assert session.session_state == {"steps": 2, "epoch": 3}


def test_save_checkpoint_writes_upstreams_layout(tmp_path):
    session = make_session()
    session.dataloader = loader = Loader()
    loader.position = 17
    with session:
        feed(session, 0.5)
        session.save_checkpoint(str(tmp_path / "ckpt"))
        want = {k: np.array(v) for k, v in session.get_named_tensors_data().to_dict().items()}
    ckpt = tmp_path / "ckpt"
    assert sorted(os.listdir(ckpt)) == ["dataloader.bin", "model", "session_info.json"]
    assert sorted(os.listdir(ckpt / "model")) == ["counter.npz", "layer.bias.npz",
                                                  "layer.weight.npz"]
    for key, value in want.items():
        with np.load(ckpt / "model" / f"{key}.npz") as f:
            assert f.files == [key]
            np.testing.assert_array_equal(f[key], value)
    assert json.loads((ckpt / "session_info.json").read_text()) == {"steps": 1}
    assert json.loads((ckpt / "dataloader.bin").read_text()) == {"position": 17}


def test_load_checkpoint_restores_state_steps_and_dataloader(tmp_path):
    src = make_session(seed=1)
    src.dataloader = Loader()
    src.dataloader.position = 5
    with src:
        feed(src, 1.0)
        feed(src, 3.0)
        src.save_checkpoint(str(tmp_path / "c"))
        want = {k: np.array(v) for k, v in src.get_named_tensors_data().to_dict().items()}
    dst = make_session(seed=2)
    dst.dataloader = loader = Loader()
    with dst:
        dst.load_checkpoint(str(tmp_path / "c"))
        got = dst.get_named_tensors_data().to_dict()
        for key in want:
            np.testing.assert_array_equal(got[key], want[key])
        assert dst.session_state == {"steps": 2}
        assert loader.position == 5 and loader.resumed_from == str(tmp_path / "c" /
                                                                    "dataloader.bin")
        feed(dst, 1.0)                              # the device got the loaded values
        np.testing.assert_array_equal(dst.get_named_tensors_data().layer.weight,
                                      want["layer.weight"] + 1.0)
    os.remove(tmp_path / "c" / "session_info.json")
    dst.load_checkpoint(str(tmp_path / "c"))
    assert dst.session_state == {"steps": 0}


@pytest.mark.parametrize("content,kind", [("[1, 2]", "array"), ('"steps"', "string"),
                                          ("7", "number"), ("null", "null")])
def test_a_session_info_that_is_no_json_object_is_refused_naming_the_file(tmp_path, content,
                                                                           kind):
    """session_info.json holding anything but an object: a ValueError naming the file, before
    anything is loaded (the session keeps its weights and state)."""
    src = make_session(seed=1)
    with src:
        feed(src, 1.0)
        src.save_checkpoint(str(tmp_path / "c"))
    info = tmp_path / "c" / "session_info.json"
    info.write_text(content)
    dst = make_session(seed=2)
    before = {k: np.array(v) for k, v in dst.get_named_tensors_data().to_dict().items()}
    with pytest.raises(ValueError, match=rf"^load_checkpoint: {info} is unreadable \(it holds a "
                                         rf"JSON {kind}, not the object of session state"):
        dst.load_checkpoint(str(tmp_path / "c"))
    assert dst.session_state == {"steps": 0}
    for key, value in dst.get_named_tensors_data().to_dict().items():
        np.testing.assert_array_equal(value, before[key])


def test_loading_is_reported_for_missing_keys(tmp_path):
    src = make_session()
    src.save_checkpoint(str(tmp_path / "c"))
    os.remove(tmp_path / "c" / "model" / "counter.npz")
    np.savez(tmp_path / "c" / "model" / "extra.npz", extra=np.zeros(2))
    dst = make_session()
    with pytest.warns(UserWarning, match=r"not in the checkpoint: \['counter'\].*not in the "
                                         r"session: \['extra'\]"):
        dst.load_checkpoint(str(tmp_path / "c"))
    with pytest.raises(ValueError, match="keys missing"):
        dst.load_checkpoint(str(tmp_path / "c"), report_missing="error")
    dst.load_checkpoint(str(tmp_path / "c"), report_missing="none")
    with pytest.raises(ValueError, match="report_missing must be one of"):
        dst.load_checkpoint(str(tmp_path / "c"), report_missing="loud")
    with pytest.raises(FileNotFoundError, match="not a checkpoint"):
        dst.load_checkpoint(str(tmp_path / "nothing"))


def test_max_checkpoints_deletes_the_oldest(tmp_path):
    session = make_session(max_checkpoints=2)
    for i in range(3):
        session.save_checkpoint(str(tmp_path / f"step_{i}"))
    assert sorted(os.listdir(tmp_path)) == ["step_1", "step_2"]
    session.save_checkpoint(str(tmp_path / "step_1"))     # saving again makes it the newest
    session.save_checkpoint(str(tmp_path / "step_3"))
    assert sorted(os.listdir(tmp_path)) == ["step_1", "step_3"]
    with pytest.raises(ValueError, match="max_checkpoints must be an int >= 1"):
        make_session(max_checkpoints=0)


def test_dataloader_needs_save_and_resume():
    session = make_session()
    with pytest.raises(ValueError, match="must have `save` and `resume`"):
        session.dataloader = object()
    session.dataloader = None


def test_load_from_session_copies_matching_keys():
    src, dst = make_session(seed=3), make_session(seed=4)
    with src, dst:
        feed(src, 2.0)
        dst.load_from_session(src)
        want = src.get_named_tensors_data().to_dict()
        got = dst.get_named_tensors_data().to_dict()
    for key in want:
        np.testing.assert_array_equal(got[key], want[key])
    dst.state.pop("counter")
    with pytest.raises(ValueError, match=r"not in this session: \['counter'\]"):
        dst.load_from_session(src, report_missing="error")


def test_replicated_and_sharded_state_round_trips(tmp_path):
    src = make_session(seed=5, replicas=2, rts=True)
    with src:
        feed(src, 1.0)
        src.save_checkpoint(str(tmp_path / "c"))
    with np.load(tmp_path / "c" / "model" / "sharded.npz") as f:
        np.testing.assert_array_equal(f["sharded"], np.arange(6) + 1.0)
    dst = make_session(seed=6, replicas=2, rts=True)
    with dst:
        dst.load_checkpoint(str(tmp_path / "c"))
        np.testing.assert_array_equal(dst.get_tensor_data(dst.state.sharded), np.arange(6) + 1.0)


def test_memmap_variables_are_copied_as_npy(tmp_path):
    src = make_session(seed=7, memmap_dir=str(tmp_path / "mm"))
    with src:
        feed(src, 1.0)
        src.save_checkpoint(str(tmp_path / "c"))
        weight = np.array(src.get_tensor_data(src.state.layer.weight))
    model = tmp_path / "c" / "model"
    assert sorted(os.listdir(model)) == ["counter.npz", "layer.bias.npy", "layer.weight.npy"]
    np.testing.assert_array_equal(np.fromfile(model / "layer.weight.npy", np.float32)
                                  .reshape(4, 3), weight)
    dst = make_session(seed=8, memmap_dir=str(tmp_path / "mm2"))
    before = np.array(dst.get_tensor_data(dst.state.layer.weight))
    dst.load_checkpoint(str(tmp_path / "c"), skip_memmap=True)
    np.testing.assert_array_equal(dst.get_tensor_data(dst.state.layer.weight), before)
    dst.load_checkpoint(str(tmp_path / "c"))
    np.testing.assert_array_equal(dst.get_tensor_data(dst.state.layer.weight), weight)

    addons.initialise_memmap_dir_from_checkpoint(str(tmp_path / "c"), str(tmp_path / "mm3"))
    assert sorted(os.listdir(tmp_path / "mm3")) == ["counter.npy", "layer.bias.npy",
                                                    "layer.weight.npy"]
    np.testing.assert_array_equal(np.fromfile(tmp_path / "mm3" / "layer.weight.npy",
                                              np.float32).reshape(4, 3), weight)
    np.testing.assert_array_equal(np.fromfile(tmp_path / "mm3" / "counter.npy", np.float32),
                                  [1.0])


def test_only_instance_0_writes(tmp_path, monkeypatch):
    monkeypatch.setattr(popdist, "getInstanceIndex", lambda: 1)
    session = make_session()
    session.save_checkpoint(str(tmp_path / "c"))
    assert not (tmp_path / "c").exists()


def test_write_variables_pb_and_wandb(tmp_path):
    session = make_session()
    addons.write_variables_pb(session, {session.state.counter: np.float32(7)})
    assert session.get_tensor_data(session.state.counter) == 7
    for call in (lambda: session.save_checkpoint("wandb://project/run"),
                 lambda: session.load_checkpoint("wandb://project/run"),
                 lambda: session.wandb_variable_histograms(0),
                 lambda: session.wandb_histogram("w", 0, np.zeros(2))):
        with pytest.raises(NotImplementedError, match="wandb"):
            call()
