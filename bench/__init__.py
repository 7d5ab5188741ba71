"""Suites, experiments, reports, the `refinery` command, the service and the RL environment."""
