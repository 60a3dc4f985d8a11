"""The parallelism planner: which tp / pp / dp / ZeRO layout a model should use. Pure package.

    planner.py      evaluate layouts (memory, compute, bubble, communication), ranked plans
    plan_space.py   the search space: request, hardware, configurations, rejections
    plan_fit.py     the memory gate, and when nothing fits: the nearest miss, how many GPUs
    memory.py       per-GPU memory as the workers hold it (per pipeline stage, deferred sync)
    plan_layout.py  how a layout maps onto the cluster's links
    autoplan.py     `parallelism: auto` at submit time
    calibration/    collective calibration: alpha-beta fits, probes, calibration.json, figures
"""
