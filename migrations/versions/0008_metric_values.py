"""metric values: every reported metric beyond the fixed columns, and each job's names

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-05 10:00:00
"""
import sqlalchemy as sa
from alembic import op

revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None

BigId = sa.BigInteger().with_variant(sa.Integer(), 'sqlite')


def upgrade() -> None:
    op.create_table('metric_values',
    sa.Column('id', BigId, autoincrement=True, nullable=False),
    sa.Column('job_id', sa.String(length=40), nullable=False),
    sa.Column('attempt', sa.Integer(), nullable=False),
    sa.Column('rank', sa.Integer(), nullable=False),
    sa.Column('step', sa.Integer(), nullable=False),
    sa.Column('time', sa.Float(), nullable=False),
    sa.Column('key', sa.String(length=64), nullable=False),
    sa.Column('value', sa.Float(), nullable=False),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], name=op.f('fk_metric_values_job_id_jobs'),
                            ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_metric_values'))
    )
    op.create_index('ix_metric_values_job_key_step', 'metric_values',
                    ['job_id', 'key', 'step'], unique=False)
    op.create_table('metric_keys',
    sa.Column('job_id', sa.String(length=40), nullable=False),
    sa.Column('key', sa.String(length=64), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], name=op.f('fk_metric_keys_job_id_jobs'),
                            ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('job_id', 'key', name=op.f('pk_metric_keys'))
    )


def downgrade() -> None:
    op.drop_table('metric_keys')
    op.drop_index('ix_metric_values_job_key_step', table_name='metric_values')
    op.drop_table('metric_values')
