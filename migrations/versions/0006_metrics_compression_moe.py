"""metrics: gradient bytes on the wire, compression ratio, MoE auxiliary loss

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01 15:50:00
"""
from alembic import op
import sqlalchemy as sa


revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None

_COLUMNS = ('grad_comm_bytes', 'grad_compression_ratio', 'moe_aux_loss')


def upgrade() -> None:
    op.add_column('metrics', sa.Column('grad_comm_bytes', sa.BigInteger(), nullable=True))
    op.add_column('metrics', sa.Column('grad_compression_ratio', sa.Float(), nullable=True))
    op.add_column('metrics', sa.Column('moe_aux_loss', sa.Float(), nullable=True))


def downgrade() -> None:
    for name in reversed(_COLUMNS):
        op.execute(f"ALTER TABLE metrics DROP COLUMN {name}")
