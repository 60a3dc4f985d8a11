"""Placement: where a job's ranks go. Pure package.

    solver.py      rank -> (node, GPU) for a whole job, or a typed PlacementFailure
    domains.py, blocks.py, gpus.py, nodeinfo.py   capacity tree, candidates, GPU picking
    links.py, cost.py     link figures and the communication cost model
    ranks.py       the one rank authority: mesh slots on chosen GPUs, ranks of landed actors
    failure.py     why a job does not fit (the "why pending" reasons)
    snapshot.py    the cluster now: Ray's nodes (or the stored ones) joined with the topology
    holds.py       which GPUs active jobs hold (placed, or planned while being placed)
    gang_plan.py   a queued job -> GangPlan (bundles, the solver's Placement) | Pending
"""
