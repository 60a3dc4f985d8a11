"""rank progress: the collectives a script rank's probe saw, when the first came and when the
count last grew

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-06 10:00:00
"""
import sqlalchemy as sa
from alembic import op

revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('ranks') as batch:
        batch.add_column(sa.Column('collectives', sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column('progress_first_at', sa.DateTime(timezone=True),
                                   nullable=True))
        batch.add_column(sa.Column('progress_at', sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('ranks') as batch:
        batch.drop_column('progress_at')
        batch.drop_column('progress_first_at')
        batch.drop_column('collectives')
