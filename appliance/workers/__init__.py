"""Front-end worker processes: the HTTP port's connections accepted and framed on several cores, every
request answered by the daemon (``pool`` in the daemon, ``worker`` in each process)."""
