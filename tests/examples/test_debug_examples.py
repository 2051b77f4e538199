"""The debugging examples run and check themselves: each exits 0 only when the tool it shows
found what it should (the NaN's origin op and line, the forgotten all-reduce, the skipped
collective, the captured values against NumPy, a bitwise replay)."""
import importlib.util
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _main(name: str):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.main


@pytest.mark.parametrize("name, argv", [
    ("debug_nans", []), ("debug_nans", ["--no-check", "--steps", "3"]),
    ("debug_replicas", []), ("debug_replicas", ["--fixed"]),
    ("debug_hang", []), ("debug_capture", []), ("debug_replay", []),
])
def test_debug_example(name, argv, monkeypatch, capsys):
    for var in ("POPXL_DEBUG_NANS", "POPXL_CHECK_REPLICAS", "POPXL_RECORD"):
        monkeypatch.setenv(var, "")       # restored (unset) afterwards: the examples set
        monkeypatch.delenv(var)           # what they show in os.environ
    assert _main(name)(argv) == 0, capsys.readouterr().out[-3000:]
