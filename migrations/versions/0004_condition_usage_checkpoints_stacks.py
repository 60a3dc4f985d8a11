"""job condition, metrics lr, rank and node usage, checkpoints, stack requests

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01 09:59:33.814691
"""
from alembic import op
import sqlalchemy as sa


revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('node_usage',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('node', sa.String(length=200), nullable=False),
    sa.Column('at', sa.Float(), nullable=False),
    sa.Column('cpu_percent', sa.Float(), nullable=True),
    sa.Column('mem_used_bytes', sa.BigInteger(), nullable=True),
    sa.Column('mem_total_bytes', sa.BigInteger(), nullable=True),
    sa.Column('gpus', sa.JSON(), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_node_usage'))
    )
    with op.batch_alter_table('node_usage', schema=None) as batch_op:
        batch_op.create_index('ix_node_usage_at', ['at'], unique=False)
        batch_op.create_index('ix_node_usage_node_at', ['node', 'at'], unique=False)

    op.create_table('checkpoints',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('job_id', sa.String(length=40), nullable=False),
    sa.Column('attempt', sa.Integer(), nullable=False),
    sa.Column('step', sa.Integer(), nullable=False),
    sa.Column('at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('size_bytes', sa.BigInteger(), nullable=True),
    sa.Column('path', sa.Text(), nullable=False),
    sa.Column('removed', sa.Boolean(), nullable=False),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], name=op.f('fk_checkpoints_job_id_jobs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_checkpoints')),
    sa.UniqueConstraint('job_id', 'attempt', 'step', name='uq_checkpoints_job_attempt_step')
    )
    with op.batch_alter_table('checkpoints', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_checkpoints_job_id'), ['job_id'], unique=False)

    op.create_table('rank_usage',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('job_id', sa.String(length=40), nullable=False),
    sa.Column('attempt', sa.Integer(), nullable=False),
    sa.Column('rank', sa.Integer(), nullable=False),
    sa.Column('node', sa.String(length=200), nullable=True),
    sa.Column('at', sa.Float(), nullable=False),
    sa.Column('cpu_percent', sa.Float(), nullable=True),
    sa.Column('rss_bytes', sa.BigInteger(), nullable=True),
    sa.Column('gpu_util', sa.Float(), nullable=True),
    sa.Column('gpu_mem_bytes', sa.BigInteger(), nullable=True),
    sa.Column('gpu_mem_total_bytes', sa.BigInteger(), nullable=True),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], name=op.f('fk_rank_usage_job_id_jobs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_rank_usage'))
    )
    with op.batch_alter_table('rank_usage', schema=None) as batch_op:
        batch_op.create_index('ix_rank_usage_job_at', ['job_id', 'at'], unique=False)

    op.create_table('stack_requests',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('job_id', sa.String(length=40), nullable=False),
    sa.Column('attempt', sa.Integer(), nullable=False),
    sa.Column('requested_by', sa.String(length=128), nullable=False),
    sa.Column('requested_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('result', sa.JSON(), nullable=True),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], name=op.f('fk_stack_requests_job_id_jobs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_stack_requests'))
    )
    with op.batch_alter_table('stack_requests', schema=None) as batch_op:
        batch_op.create_index('ix_stack_requests_job_id_id', ['job_id', 'id'], unique=False)
        batch_op.create_index('ix_stack_requests_state', ['state'], unique=False)

    # Plain ALTERs (see 0003): a batch rebuild of `jobs` would cascade to every child row.
    op.add_column('jobs', sa.Column('condition', sa.JSON(), nullable=True))
    op.add_column('metrics', sa.Column('lr', sa.Float(), nullable=True))



def downgrade() -> None:
    op.execute("ALTER TABLE metrics DROP COLUMN lr")
    op.execute("ALTER TABLE jobs DROP COLUMN condition")

    with op.batch_alter_table('stack_requests', schema=None) as batch_op:
        batch_op.drop_index('ix_stack_requests_state')
        batch_op.drop_index('ix_stack_requests_job_id_id')

    op.drop_table('stack_requests')
    with op.batch_alter_table('rank_usage', schema=None) as batch_op:
        batch_op.drop_index('ix_rank_usage_job_at')

    op.drop_table('rank_usage')
    with op.batch_alter_table('checkpoints', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_checkpoints_job_id'))

    op.drop_table('checkpoints')
    with op.batch_alter_table('node_usage', schema=None) as batch_op:
        batch_op.drop_index('ix_node_usage_node_at')
        batch_op.drop_index('ix_node_usage_at')

    op.drop_table('node_usage')
