"""Process plumbing: settings, logging and its event names, metrics, supervised tasks,
backoff, group commit, and running async code to its end on a blocking caller's thread."""
