"""Versions: the PopXL/PopART release the emulator follows and popxl-dist's own.

The `__version__` of the emulated packages that have one upstream (`popxl`, `popart`,
`popart._internal.ir`) is the upstream release with a PEP 440 local label naming the emulator, e.g.
`3.4.0+emulator.0.1.0` (popxl-dist 0.1.0 emulating 3.4.0; already in PEP 440's normal form): code
comparing versions sees 3.4.0 (`Version(v).public`; a local label sorts just after its public
version), and a person reading it sees that the imported `popxl` is the emulator.
`popart.versionString()` stays the bare upstream release, as programs parse and log it.
"""
UPSTREAM_VERSION = (3, 4, 0)
PROJECT_VERSION = "0.1.0"   # popxl-dist's own release (pyproject.toml reads it from here)
EMULATOR_VERSION = "{}.{}.{}+emulator.{}".format(*UPSTREAM_VERSION, PROJECT_VERSION)
