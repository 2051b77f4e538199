"""Grad rules, one module per op family, named as the family's builder module in `popxl.ops` and
kernel module in `popxl.engine.kernels` (auto-loaded by grad_registry.load_all; `_`-prefixed
modules are helpers)."""
