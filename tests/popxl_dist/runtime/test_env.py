"""The `POPXL_*` settings the runtimes read."""
import pytest

from popxl.runtime.env import ray_address


@pytest.mark.parametrize("popxl, ray, expected", [
    ("", "", ""),                                   # start a new local Ray
    ("10.0.0.1:6379", "", "10.0.0.1:6379"),
    ("", "10.0.0.2:6379", "10.0.0.2:6379"),         # Ray's own variable is honoured
    ("10.0.0.1:6379", "10.0.0.2:6379", "10.0.0.1:6379"),
])
def test_ray_address_prefers_popxl_then_ray_variable(monkeypatch, popxl, ray, expected):
    monkeypatch.setenv("POPXL_RAY_ADDRESS", popxl)
    monkeypatch.setenv("RAY_ADDRESS", ray)
    assert ray_address() == expected
