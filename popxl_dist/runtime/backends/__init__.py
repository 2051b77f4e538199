"""The single-controller backends: one script drives worker pools (`local`, threads, `mpi`,
`ray`), the worker side they share (`service.py`), and how failures travel back to the host."""
