"""The parallelism planner: which tp / pp / dp / ZeRO layout a model should use. Pure package.

    planner.py      enumerate layouts, memory and step-time estimates, ranked plans
    memory.py       per-GPU memory arithmetic (parameters, gradients, optimizer, activations)
    plan_layout.py  how a layout maps onto the cluster's links
    autoplan.py     `parallelism: auto` at submit time
    calibration/    collective calibration: alpha-beta fits, probes, calibration.json, figures
"""
