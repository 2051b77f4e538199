"""Sphinx configuration of popxl-dist's documentation (MyST Markdown pages, Furo theme).

Built strictly by the tests (tests/test_docs.py): `sphinx-build -W -b html docs DIR` fails on
a broken link, a missing page or anchor, or an API entry that does not import."""
from popart._version import PROJECT_VERSION

project = "popxl-dist"
author = "popxl-dist"
copyright = "popxl-dist contributors (MIT)"
version = release = PROJECT_VERSION

extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.napoleon"]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build", "benchmarks/results/README.md"]
myst_heading_anchors = 3           # `page.md#a-heading` links are checked
myst_enable_extensions = ["colon_fence"]
suppress_warnings: list = []
nitpicky = False                   # upstream's types (popxl.Tensor, ...) have no pages here
autodoc_typehints = "description"
autodoc_member_order = "bysource"
html_theme = "furo"
html_title = "popxl-dist"
