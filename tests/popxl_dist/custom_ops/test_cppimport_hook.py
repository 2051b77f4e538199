"""The cppimport interception: an application's `import cppimport.import_hook` + `from . import
<binding>` (and `cppimport.imp`) give the emulator's implementation, whether the real cppimport
is installed (here a package shaped like it, whose hook would compile: it goes first on
sys.meta_path, before or after popxl is imported) or not (hidden from the import system). Each
case runs in its own interpreter."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cppapp_files import fake_real_cppimport, write_app

PROGRAM = textwrap.dedent("""\
    import sys
    {prelude}
    import numpy as np
    import popxl
    import popxl.ops as ops
    {import_ops}
    from {pkg}.scaled_leak.scaled_leak import scaled_leak
    import cppimport
    from popxl.custom_ops import BindingModule

    # popxl's finder stays ahead of any cppimport hook
    assert type(sys.meta_path[0]).__name__ == "CppimportFinder", sys.meta_path
    binding = sys.modules["{pkg}.scaled_leak.scaled_leak_binding"]
    assert isinstance(binding, BindingModule), binding
    print("cppimport:", getattr(cppimport, "__version__", "?"))
    # cppimport's explicit API resolves to the same module
    assert cppimport.imp("{pkg}.scaled_leak.scaled_leak_binding") is binding
    assert cppimport.build_filepath(binding.__file__).endswith("scaled_leak_binding.cpp")
    cppimport.build_all(".")
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.array([[-2.0, 3.0]], np.float32))
        w = popxl.variable(np.array([1.0, 2.0], np.float32))
        y, z = scaled_leak(x, w, 0.5)
        s = popxl.d2h_stream(y.shape, y.dtype)
        ops.host_store(s, y)
    with popxl.Session(ir, "ipu_hw") as session:
        print("y:", session.run()[s].tolist())
    """)

HIDE = textwrap.dedent("""\
    import importlib.abc


    class Hide(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name == "cppimport" or name.startswith("cppimport."):
                raise ModuleNotFoundError(name)


    sys.meta_path.insert(0, Hide())""")


def _run(tmp_path: Path, pkg: str, prelude: str, fake_real: bool,
         env_registration: bool = False) -> subprocess.CompletedProcess:
    """Run the program; the op's registration is imported by it, or (`env_registration`) named
    in POPXL_CUSTOM_OPS."""
    write_app(tmp_path, pkg)
    path = [str(tmp_path)]
    if fake_real:
        fake_real_cppimport(tmp_path / "site")
        path.append(str(tmp_path / "site"))
    script = tmp_path / "program.py"
    script.write_text(PROGRAM.format(prelude=prelude, pkg=pkg, import_ops="" if env_registration
                                     else "import emulated_ops"))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path))
    env.pop("POPXL_CUSTOM_OPS", None)
    if env_registration:
        env["POPXL_CUSTOM_OPS"] = "emulated_ops"
    return subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("prelude", ["", "import cppimport.import_hook"],
                         ids=["popxl_first", "cppimport_hook_first"])
def test_with_a_real_cppimport_installed(tmp_path, prelude):
    proc = _run(tmp_path, "appreal", prelude, fake_real=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "cppimport: fake-real" in proc.stdout          # the installed package was loaded
    assert "y: [[-1.0, 6.0]]" in proc.stdout


def test_without_cppimport(tmp_path):
    """Also: the registering module comes from POPXL_CUSTOM_OPS (the program does not import
    it)."""
    proc = _run(tmp_path, "appnone", HIDE, fake_real=False, env_registration=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "cppimport: popxl-dist stand-in" in proc.stdout
    assert "y: [[-1.0, 6.0]]" in proc.stdout


def test_a_second_copy_of_popxl_keeps_one_finder(tmp_path):
    """Importing popxl's source folder under a second name (a second copy of the package) must
    leave one finder, the first copy's (whose registrations the program uses), not two that
    consult each other."""
    import popxl

    src = Path(popxl.__file__).parent
    program = tmp_path / "twice.py"
    program.write_text(textwrap.dedent(f"""\
        import importlib.util, sys
        import popxl
        first = sys.meta_path[0]
        spec = importlib.util.spec_from_file_location(
            "popxl_copy", {str(src / "__init__.py")!r},
            submodule_search_locations=[{str(src)!r}])
        copy = importlib.util.module_from_spec(spec)
        sys.modules["popxl_copy"] = copy
        spec.loader.exec_module(copy)
        ours = [f for f in sys.meta_path if getattr(f, "_popxl_cppimport_finder", False)]
        assert ours == [first] and sys.meta_path[0] is first, sys.meta_path
        import cppimport.import_hook
        print("ok")
        """))
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    proc = subprocess.run([sys.executable, str(program)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "ok"
