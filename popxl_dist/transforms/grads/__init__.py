"""Grad rules, one module per op family (auto-loaded by grad_registry.load_all)."""
