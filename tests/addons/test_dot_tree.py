"""DotTree / NamedTensors / NamedVariableFactories / VariableFactory unit tests."""
from functools import partial

import numpy as np
import pytest

import popxl
import popxl_addons as addons
from popxl_addons import DotTree, NamedTensors, NamedVariableFactories, VariableFactory


def test_insert_get_attr_and_nesting():
    t = DotTree()
    t.insert("a.b", 1)
    t.insert("a.c", 2)
    t.insert(0, "zero")
    t.insert(2, "two")
    assert t.a.b == 1 and t["a.c"] == 2 and t.get("a").to_dict() == {"b": 1, "c": 2}
    assert t[0] == "zero" and t.get("0") == "zero" and t[-1] == "two"
    with pytest.raises(KeyError):
        t[-2]   # slot 1 is a hole: not skipped
    assert list(t.to_dict()) == ["a.b", "a.c", "0", "2"]
    assert "a.b" in t and "a.x" not in t and 2 in t
    with pytest.raises(ValueError, match="'a.b' already exists"):
        t.insert("a.b", 3)
    with pytest.raises(ValueError, match="Numerical key cannot be negative"):
        t.insert(-1, 3)
    with pytest.raises(ValueError, match="not a valid python identifier"):
        t.insert("a.b-c", 3)
    with pytest.raises(AttributeError, match="No attribute 'nope'. Available Keys:"):
        t.nope
    with pytest.raises(KeyError, match="Key does not exist: x"):
        t.get("x")
    t.insert("a.b", 5, overwrite=True)
    assert t.a.b == 5 and t.a.c == 2   # nested trees merged, leaf replaced
    with pytest.raises(ValueError):
        t.insert("a.b.c", 1)   # below a leaf: fails and rolls back
    assert t.a.b == 5


def test_update_copy_pop_filter_map_pack():
    t = DotTree.from_dict({"x.y": 1, "x.z": 2, "w": 3})
    c = t.copy()
    c.insert("x.q", 4)
    assert "x.q" not in t   # structure copied
    u = DotTree.from_dict({"v": 9})
    t.update(u)
    assert t.v == 9
    with pytest.raises(ValueError, match="already exists"):
        t.update(DotTree.from_dict({"w": 1}))
    t.update(DotTree.from_dict({"x.k": 1}), overwrite=True)
    assert t.x.to_dict() == {"k": 1}   # top-level key replaced the whole subtree
    assert t.pop("x.k") == 1 and t.pop("w") == 3
    f = DotTree.from_dict({"a.b": 1, "a.c": 2, "d": 3}).filter_keys(["a.c", "d"])
    assert f.to_dict() == {"a.c": 2, "d": 3}
    with pytest.raises(ValueError):
        f.filter_keys(["d", "d"])
    assert f.map(lambda v: v * 10).to_dict() == {"a.c": 20, "d": 30}
    keys, values = DotTree.from_dict({"b": 2, "a.z": 1, "a.a": 0}).unpack()
    assert keys == ("a.a", "a.z", "b") and values == (0, 1, 2)
    assert DotTree().unpack() == ([], [])
    assert DotTree.pack(keys, values).to_dict() == {"a.a": 0, "a.z": 1, "b": 2}
    assert len(f) == 2 and f.len_flat() == 2 and list(f.keys()) == ["a", "d"]
    a = DotTree.from_dict({"p": "A", "q": "B"})
    b = DotTree.from_dict({"q": "b", "r": "c"})
    assert a.to_mapping(b) == {"B": "b"} and addons.to_mapping(a, b) == {"B": "b"}
    a._clear()
    assert a.len_flat() == 0


def test_repr_and_ordered_dict():
    t = DotTree.from_dict({"a.b": 1, "c": 2})
    assert repr(t) == "{'a.b': 1, 'c': 2}" and str(t) == repr(t)
    d = t.to_dict()
    assert isinstance(d, addons.OrderedDict) and repr(d) == "{\na.b: 1,\nc: 2,\n}"
    assert d.idx(1) == 2 and str(d.keys()) == "dict_keys(['a.b', 'c'])"
    assert addons.sanitise("Net_subgraph(0)/fc1.w") == "Net_subgraph_0__fc1_w"


def test_named_tensors_and_factories_init_order():
    ir = popxl.Ir()
    with ir.main_graph:
        draws = []

        def data(shape):
            draws.append(shape)
            return np.random.normal(size=shape)

        facts = NamedVariableFactories()
        facts.insert("fc2.weight", VariableFactory(partial(data, (2,)), popxl.float32))
        facts.insert("fc10.weight", VariableFactory(partial(data, (3,)), popxl.float32))
        facts.insert("fc1.bias", VariableFactory(partial(np.zeros, 4), popxl.float32))
        assert draws == [(2,), (2,), (3,), (3,)]   # smoke-test call + peek per factory
        v1 = facts.init()
        assert draws == [(2,), (2,), (3,), (3,)]   # first init uses the peeked draw
        v2 = facts.init(prefix="copy")
        assert draws[4:] == [(3,), (2,)]          # "fc10" sorts before "fc2"
        assert list(v1.to_dict()) == ["fc1.bias", "fc10.weight", "fc2.weight"]
        assert [t.name for t in v2.tensors] == ["copy.fc1.bias", "copy.fc10.weight",
                                                "copy.fc2.weight"]
        assert isinstance(v1, NamedTensors) and v1.named_tensors == dict(v1.to_dict())
        assert v1.remap({t: u for t, u in v1.to_mapping(v2).items()}).to_dict() == v2.to_dict()
        zeros = facts.init_zero()
        assert zeros.fc1.bias.shape == (4,)
        assert facts.replica_groupings.fc1.bias.group_size == 1


def test_variable_factory_errors_and_seeded_draws():
    ir = popxl.Ir()
    with ir.main_graph:
        with pytest.raises(ValueError, match="throws error"):
            VariableFactory(lambda: 1 / 0)
        with pytest.raises(ValueError, match="must be an iterable or callable"):
            VariableFactory(object())
        vf = VariableFactory(iter([np.ones((2,)), np.zeros((2,))]))
        assert vf.dtype == popxl.float32 and vf.shape == (2,)   # float64 downcast
        np.random.seed(1)
        f = VariableFactory(partial(np.random.normal, 0, 1, (3,)), popxl.float32)
        np.random.seed(1)
        np.random.normal(0, 1, (3,))                 # the thrown-away smoke-test draw
        second = np.random.normal(0, 1, (3,)).astype(np.float32)
        v = f.create_tensor("v")
        sharded = VariableFactory(partial(np.zeros, (4, 3)), popxl.float32, shard_over=4)
        assert sharded.shape == (3,) and sharded.meta_shape == (4, 3)
    with popxl.Session(ir, "ipu_hw") as s:
        np.testing.assert_array_equal(s.get_tensor_data(v), second)


def test_numeric_key_bounds_and_messages_as_upstream():
    """Numerical keys must exist (negative ones count back from the largest numerical key);
    a dotted key below a leaf, a negative insert key and duplicate filter keys are refused,
    each with upstream's wording."""
    t = addons.DotTree()
    t.insert(0, "zero")
    t.insert(1, "one")
    t.insert("leaf", 1)
    assert t.get(-1) == "one" and t[-2] == "zero" and t.get("1") == "one"
    with pytest.raises(KeyError, match=r"Negative numerical key does not exist: -3\. Max "
                                       r"numerical key: 1\."):
        t.get(-3)
    with pytest.raises(KeyError, match=r"Numerical key does not exist: 5\. Available keys: "
                                       r"\['0', '1', 'leaf'\]"):
        t.get(5)
    with pytest.raises(KeyError, match=r"Numerical key does not exist: 7\."):
        t.get("7")
    with pytest.raises(KeyError, match=r"Key exists \(leaf\) but is not a sub-DotTree of type "
                                       r".* and therefore you cannot access the sub-key: "
                                       r"\['x'\]\."):
        t.get("leaf.x")
    with pytest.raises(ValueError, match=r"^Numerical key cannot be negative: -1$"):
        t.insert(-1, "minus one")
    with pytest.raises(ValueError, match=r"^`keys` cannot contain duplicate values\."):
        t.filter_keys(["leaf", "leaf"])
    gap = addons.DotTree()
    gap.insert(0, "a")
    gap.insert(2, "c")
    with pytest.raises(KeyError, match=r"Negative numerical key does not exist: -2\. "
                                       r"Equivalent positive key: 1\."):
        gap.get(-2)


def test_a_tree_is_true_even_when_empty_as_upstream():
    from popxl_addons import DotTree

    tree = DotTree()
    tree.insert("foo.bar", "baz")
    tree._clear()
    assert tree.foo and not hasattr(tree.foo, "bar") and len(tree.foo) == 0
    assert DotTree()
