"""Process plumbing: settings, logging and its event names, metrics, supervised tasks,
backoff, group commit, riding out a failover."""
