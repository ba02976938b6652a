"""Following streams: the jobs' change stream and its resume token, cron schedules,
triggers on an application's collections, and this dispatcher's presence."""
