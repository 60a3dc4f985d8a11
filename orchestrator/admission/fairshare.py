"""The order the scheduler tries queued jobs in: priority, then fair share between users.

Pure. Higher priority first. Among jobs of equal priority, the next job is the one whose
owner holds the smallest dominant share of the cluster — the larger of their GPU share and
their CPU share (dominant resource fairness) — counting, as the order is built, the jobs
already ahead of it as if they were placed; ties go to the earlier submission. So a user with
ten queued jobs and one with one alternate instead of the first user's ten going first, and
a user already holding most of the cluster waits behind one holding little.

>>> jobs = [Queued("a1", "ann", 0, 1, Usage(4, 4)), Queued("a2", "ann", 0, 2, Usage(4, 4)),
...         Queued("b1", "bob", 0, 3, Usage(4, 4))]
>>> [j.id for j in fair_order(jobs, held={}, total=Usage(16, 16))]
['a1', 'b1', 'a2']
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import groupby

from orchestrator.admission.quotas import Usage


@dataclass(frozen=True)
class Queued:
    id: str
    owner: str
    priority: int
    seq: int  # submission order
    size: Usage  # what the job holds once placed


def fair_order(jobs: Sequence[Queued], *, held: Mapping[str, Usage],
               total: Usage) -> list[Queued]:
    """`held`: what each user's active jobs hold now; `total`: the cluster's capacity."""
    out: list[Queued] = []
    usage = dict(held)
    by_priority = sorted(jobs, key=lambda j: (-j.priority, j.seq))
    for _, level in groupby(by_priority, key=lambda j: j.priority):
        queues: dict[str, deque[Queued]] = {}
        for job in level:  # seq order within each owner
            queues.setdefault(job.owner, deque()).append(job)
        heap = [(usage.get(o, Usage()).share(total), q[0].seq, o) for o, q in queues.items()]
        heapq.heapify(heap)
        while heap:
            _, _, owner = heapq.heappop(heap)
            job = queues[owner].popleft()
            out.append(job)
            usage[owner] = usage.get(owner, Usage()) + job.size
            if queues[owner]:
                heapq.heappush(heap, (usage[owner].share(total), queues[owner][0].seq, owner))
    return out
