"""meshyard's control plane and its pure core.

Contracts: spec (JobSpec), lifecycle (states, transitions), mesh (rank <-> coordinates),
settings, documents (the JSON / YAML decoder), ranges. Packages: topology, placement, planner,
watchdog (pure), store (SQLAlchemy), runtime (Ray). tests/unit/test_architecture.py keeps the
pure core free of Ray, torch, FastAPI and SQLAlchemy and the imports free of cycles.
"""
