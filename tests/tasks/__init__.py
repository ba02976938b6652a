"""Task modules the tests load through `BROOK_TASKS` (`tests.tasks.basic` is the default set)."""
