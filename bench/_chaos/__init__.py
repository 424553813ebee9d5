"""The chaos harness: workers, servers and faults against troth's promises, then a check.

One library for the soak (``bench/chaos.py``) and the CI test (``tests/chaos/``):

- ``journal``  the append-only files the run leaves: the side-effect ledger the
               workers' steps write, the acknowledged writes of the load
               generator, the faults of the injector (one JSON object a line,
               ``O_APPEND``, fsync'd)
- ``worker``   the worker process (a script): the workflows and their step function
- ``procs``    processes the harness owns: a private PostgreSQL cluster, server
               replicas on fixed ports, worker processes, the injected clock files
- ``load``     the load generator: starts workflows, settles at random times
- ``faults``   the fault injector: SIGKILL, SIGSTOP/SIGCONT, PostgreSQL restarts,
               clock jumps and replica skew
- ``checker``  pure: journal + what the public API reads back -> anomalies
- ``run``      one run end to end, and the report it prints
"""
