"""meshyard's user-facing API: what a user's own training code imports (`meshyard.train`).

Importing it is cheap (stdlib only; torch is imported by `meshyard.train.torch` and
`meshyard.parallel`), and nothing in this package imports meshyard's control plane or
workers (`api`, `orchestrator`, `workers`): a user's code may have top-level packages of
those names and runs unmodified. `python -m meshyard.runner` starts every rank process of a
user-code job.
"""
