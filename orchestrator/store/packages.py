"""Who uploaded which code package: the rows that make a package its uploaders' own."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from orchestrator.store import models as m
from orchestrator.store.base import StoreBase


class PackageOps(StoreBase):
    def add_package_owner(self, sha256: str, owner: str) -> bool:
        """Records that `owner` uploaded the package; False when they already had."""
        if self.owns_package(sha256, owner):
            return False
        try:
            with self._tx() as s:
                s.add(m.PackageOwner(sha256=sha256, owner=owner))
        except IntegrityError:  # the same user's concurrent upload recorded it first
            return False
        return True

    def owns_package(self, sha256: str, owner: str) -> bool:
        with self._tx() as s:
            return s.scalar(select(m.PackageOwner.sha256).where(
                m.PackageOwner.sha256 == sha256, m.PackageOwner.owner == owner)) is not None
