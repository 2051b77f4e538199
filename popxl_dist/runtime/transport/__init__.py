"""How processes of one job talk: byte pipes (shared-memory rings, sockets), the message layer
over them, building a job's links with its per-job secret, and noticing a host that stopped
answering. No module here knows about backends or instances."""
