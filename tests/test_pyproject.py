"""pyproject.toml lists every folder a wheel must contain (a folder of files under a package that
is not listed is left out of `pip install .` with a setuptools warning, as the MNIST copy was)."""
import os
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")   # Python 3.11+

ROOT = Path(__file__).resolve().parents[1]


def test_every_folder_under_a_package_is_listed_with_its_data():
    setup = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    package_dir, listed = setup["package-dir"], set(setup["packages"])
    package_data = setup.get("package-data", {})
    found = {}
    for name, folder in package_dir.items():
        for root, dirs, files in os.walk(ROOT / folder):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            files = [f for f in files if not f.endswith(".pyc")]
            if files:
                rel = Path(root).relative_to(ROOT / folder).parts
                found[".".join((name,) + rel)] = files
    assert sorted(set(found) - listed) == []
    for package, files in found.items():
        data = [f for f in files if not f.endswith(".py")]
        patterns = package_data.get(package, [])
        unlisted = [f for f in data if not any(Path(f).match(p) for p in patterns)]
        assert unlisted == [], f"{package}: files no package-data pattern ships"


def test_license_is_an_spdx_string_and_the_version_comes_from_the_code():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert isinstance(project["license"], str)
    assert "version" in project["dynamic"]
