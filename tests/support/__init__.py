"""Helpers shared by the test packages that run real jobs (runtime, watchdog, e2e)."""
