"""The worker protocol: the contract between a dispatcher and the worker processes that
run its jobs."""
