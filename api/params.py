"""Query and path parameter types, each range-checked to the column it is compared with.

A number past a column's range is a 422 naming the parameter, never a database error: SQLite
cannot bind integers past 64 bits, and PostgreSQL's INTEGER is 32-bit.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Query

from orchestrator.bounds.limits import INT32_MAX, INT64_MAX
from orchestrator.spec import PRINTABLE_RE

After = Annotated[int, Query(ge=0, le=INT64_MAX,
                             description="Only items with id > after (poll cursor).")]
RankQuery = Annotated[int | None, Query(ge=0, le=INT32_MAX, description="Only this rank.")]
AttemptQuery = Annotated[int | None, Query(ge=1, le=INT32_MAX, description="Default: current.")]
StepQuery = Annotated[int | None, Query(ge=-1, le=INT32_MAX,
                                        description="Only steps after this one.")]


def text_query(description: str) -> object:
    """A short text parameter without control characters (PostgreSQL refuses NUL)."""
    return Query(max_length=200, pattern=PRINTABLE_RE, description=description)
SinceQuery = Annotated[float | None, Query(ge=0, le=1e11, description=(
    "Only samples taken after this unix time (seconds)."))]
