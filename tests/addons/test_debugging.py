"""debugging.print_tensor / print_text: printed at run time only when MODEL_LOG_LEVEL allows."""
from __future__ import annotations

import numpy as np
import pytest

import popxl
import popxl.ops as ops
import popxl_addons as addons
from popxl_addons import debugging


@pytest.mark.parametrize("env_level, printed", [("TRACE", True), ("DEBUG", True),
                                                ("INFO", False), ("WARN", False)])
def test_print_only_at_or_above_model_log_level(monkeypatch, capfd, env_level, printed):
    monkeypatch.setattr(debugging, "MODEL_LOG_LEVEL_VAL", debugging.LEVELS[env_level])
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.array([1.0, 2.0], np.float32), name="x")
        y = addons.print_tensor(x * 2.0, title="doubled")            # level DEBUG
        addons.print_text("reached the end", 7)
        warn = addons.print_tensor(x, title="always", level="WARN")
        s = popxl.d2h_stream((2,), popxl.float32, "y")
        ops.host_store(s, y)
    types = [op.type for op in ir.main_graph._data.ops]
    assert types.count("PrintTensor") == (3 if printed else 1)
    assert (y.id.startswith("print")) == printed and warn is not x
    with popxl.Session(ir, "ipu_hw") as sess:
        np.testing.assert_array_equal(sess.run()[s], [2.0, 4.0])
    out = capfd.readouterr().err             # PrintTensor output goes to stderr, as upstream
    assert ("doubled: [2. 4.]" in out) == printed
    assert ("reached the end: 7" in out) == printed
    assert "always: [1. 2.]" in out


def test_bad_level():
    ir = popxl.Ir()
    with ir.main_graph, pytest.raises(ValueError, match="level must be one of"):
        addons.print_text("x", level="LOUD")
