"""The job domain, without a database: statuses and transitions, the job model,
validation, workflows, queue limits, schedules, cron and errors."""
