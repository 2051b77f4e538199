"""The emulated packages' `__version__` says emulator and still compares as upstream's release."""
import importlib.metadata
import re
import subprocess
import sys

from packaging.version import Version

import popart
import popart._internal.ir
import popxl
from popart._version import PROJECT_VERSION


def test_version_string_names_the_emulator_and_is_pep440_normal():
    for module in (popxl, popart, popart._internal.ir):
        v = module.__version__
        assert v == f"3.4.0+emulator.{PROJECT_VERSION}", module.__name__
        parsed = Version(v)
        assert str(parsed) == v                 # already in PEP 440's normal form
        assert parsed.public == popart.versionString() == "3.4.0"
        assert parsed.local.startswith("emulator.")
        # programs comparing versions see 3.4.0 (the local label sorts just after it)
        assert Version("3.4.0") <= parsed < Version("3.4.1")
        assert parsed > Version("3.3.0") and parsed.release[:2] == (3, 4)


def test_project_version_is_the_installed_distributions():
    assert re.fullmatch(r"\d+\.\d+\.\d+", PROJECT_VERSION)
    assert importlib.metadata.version("popxl-dist") == PROJECT_VERSION


def test_the_readme_way_of_telling_which_popxl_is_active():
    out = subprocess.run([sys.executable, "-c",
                          "import popxl; print(popxl.__file__, popxl.__version__)"],
                         capture_output=True, text=True, check=True).stdout.split()
    assert out[0] == popxl.__file__ and out[1].endswith(f"+emulator.{PROJECT_VERSION}")
