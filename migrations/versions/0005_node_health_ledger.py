"""node health ledger

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01 12:17:16
"""
from alembic import op
import sqlalchemy as sa


revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('node_health',
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('node_id', sa.String(length=64), nullable=True),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('reason', sa.Text(), nullable=False),
    sa.Column('since', sa.DateTime(timezone=True), nullable=True),
    sa.Column('until', sa.DateTime(timezone=True), nullable=True),
    sa.Column('permanent', sa.Boolean(), nullable=False),
    sa.Column('cleared_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('gpus', sa.JSON(), nullable=False),
    sa.Column('evidence', sa.JSON(), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('name', name=op.f('pk_node_health'))
    )
    with op.batch_alter_table('node_health', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_node_health_state'), ['state'], unique=False)



def downgrade() -> None:
    with op.batch_alter_table('node_health', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_node_health_state'))

    op.drop_table('node_health')
