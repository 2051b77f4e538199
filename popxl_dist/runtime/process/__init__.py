"""Process care shared by the layers above: liveness watchdogs, waiting without spinning,
process trees, MPICH's shared-memory segments, and joining, quieting and reaping Ray."""
