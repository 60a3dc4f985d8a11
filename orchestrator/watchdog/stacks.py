"""Every rank's Python stacks, grouped the way py-spy dump readers expect: identical stacks
merged, with the ranks (and thread names) that share them. Pure module.

>>> groups = group_stacks({0: {"MainThread (training)": "a\\nb"}, 1: {"MainThread (training)":
...                        "a\\nb"}, 2: {"MainThread (training)": "a\\nc"}})
>>> [(g.ranks, g.training) for g in groups]
[((0, 1), True), ((2,), True)]
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from orchestrator.ranges import format_ranges

TRAINING = "(training)"  # the thread label suffix workers give the training thread


@dataclass(frozen=True)
class StackGroup:
    stack: str
    ranks: tuple[int, ...]
    threads: tuple[str, ...]  # the thread names that run it, across those ranks

    @property
    def training(self) -> bool:
        return any(t.endswith(TRAINING) for t in self.threads)

    def to_dict(self) -> dict[str, Any]:
        return {"stack": self.stack, "ranks": list(self.ranks),
                "ranks_text": format_ranges(self.ranks), "threads": list(self.threads),
                "training": self.training}


def group_stacks(ranks: Mapping[int, Mapping[str, str]]) -> list[StackGroup]:
    """Groups identical stack texts across ranks and threads. Order: training-thread stacks
    first, then the largest groups (a lone rank elsewhere is often the culprit: it comes
    right after its peers' group)."""
    members: dict[str, tuple[set[int], set[str]]] = {}
    for rank, threads in ranks.items():
        for thread, text in threads.items():
            key = text.rstrip()
            got = members.setdefault(key, (set(), set()))
            got[0].add(int(rank))
            got[1].add(str(thread))
    groups = [StackGroup(stack=text, ranks=tuple(sorted(rs)), threads=tuple(sorted(ts)))
              for text, (rs, ts) in members.items()]
    return sorted(groups, key=lambda g: (not g.training, -len(g.ranks), g.ranks, g.threads))
