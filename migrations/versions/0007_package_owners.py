"""package owners: who uploaded which code package

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-04 10:00:00
"""
import re

import sqlalchemy as sa
from alembic import op

revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None

_PACKAGE_RE = re.compile(r"^package:sha256:([0-9a-f]{64})$")


def upgrade() -> None:
    table = op.create_table('package_owners',
    sa.Column('sha256', sa.String(length=64), nullable=False),
    sa.Column('owner', sa.String(length=128), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('sha256', 'owner', name=op.f('pk_package_owners'))
    )
    # Packages uploaded before owners were recorded belong to the users whose jobs ran them;
    # any other stored package only admins may use until its uploader sends it again.
    jobs = sa.table('jobs', sa.column('owner', sa.String()), sa.column('spec', sa.JSON()),
                    sa.column('created_at', sa.DateTime(timezone=True)))
    owners: dict[tuple[str, str], object] = {}
    for owner, spec, created in op.get_bind().execute(
            sa.select(jobs.c.owner, jobs.c.spec, jobs.c.created_at)):
        entry = spec.get('entrypoint') if isinstance(spec, dict) else None
        found = _PACKAGE_RE.match(str((entry or {}).get('working_dir') or ''))
        if found:
            owners.setdefault((found.group(1), owner), created)
    if owners:
        op.bulk_insert(table, [{'sha256': d, 'owner': o, 'created_at': t}
                               for (d, o), t in owners.items()])


def downgrade() -> None:
    op.drop_table('package_owners')
