"""Queue policy beyond "place what fits": aging, reservations with backfill, preemption choice.

Pure package (stdlib and the pure placement code). The inputs are small frozen dataclasses
(`jobs.py`: `QueuedJob`, `RunningJob`), the cluster is a `ClusterSnapshot`, and every
question "does this gang fit here?" goes to a caller-supplied `Planner` (the scheduler's gang
planner, `orchestrator.placement.gang_plan.plan_job`, in production), so a reserved or freed
set of GPUs is always one the gang can really use (TP groups inside NVLink domains, ...).

  aging.py       effective priority = priority + waited / AGING_LEVEL_S (one level an hour)
  reservation.py when GPUs free up (running jobs' estimated ends), the earliest set the gang
                 can use, and the backfill rule for jobs behind it
  preemption.py  the cheapest set of lower-priority running jobs whose GPUs make a gang fit
  policy.py      one scheduling pass under a `Policy` (skip, fifo, reserve, reserve+preempt)
"""
