"""popdist instances (`Ir(replication="popdist")`, one process per instance as poprun starts
them): the process's instance group over MPI or over the job's links, and their Runtime."""
