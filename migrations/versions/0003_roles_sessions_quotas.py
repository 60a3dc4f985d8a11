"""roles, dashboard sessions, per-user quotas

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02 09:00:00
"""
from alembic import op
import sqlalchemy as sa


revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('users', sa.Column('role', sa.String(length=16), nullable=False,
                                     server_default='user'))
    op.execute("UPDATE users SET role = 'admin' WHERE is_admin")
    # A plain ALTER (SQLite >= 3.35 drops a column in place): batch mode would rebuild the
    # table, and with foreign keys on, dropping the old one would cascade to every token.
    op.execute("ALTER TABLE users DROP COLUMN is_admin")
    op.create_table('dashboard_sessions',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('secret_hash', sa.String(length=64), nullable=False),
    sa.Column('user_id', sa.Integer(), nullable=False),
    sa.Column('token_id', sa.Integer(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('expires_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['token_id'], ['api_tokens.id'],
                            name=op.f('fk_dashboard_sessions_token_id_api_tokens'),
                            ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['user_id'], ['users.id'],
                            name=op.f('fk_dashboard_sessions_user_id_users'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_dashboard_sessions')),
    sa.UniqueConstraint('secret_hash', name=op.f('uq_dashboard_sessions_secret_hash'))
    )
    op.create_index(op.f('ix_dashboard_sessions_expires_at'), 'dashboard_sessions',
                    ['expires_at'], unique=False)
    op.create_index(op.f('ix_dashboard_sessions_token_id'), 'dashboard_sessions', ['token_id'],
                    unique=False)
    op.create_index(op.f('ix_dashboard_sessions_user_id'), 'dashboard_sessions', ['user_id'],
                    unique=False)
    op.create_table('user_quotas',
    sa.Column('user_id', sa.Integer(), nullable=False),
    sa.Column('max_queued_jobs', sa.Integer(), nullable=True),
    sa.Column('max_running_gpus', sa.Integer(), nullable=True),
    sa.Column('max_running_cpus', sa.Float(), nullable=True),
    sa.Column('max_priority', sa.Integer(), nullable=True),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['user_id'], ['users.id'], name=op.f('fk_user_quotas_user_id_users'),
                            ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('user_id', name=op.f('pk_user_quotas'))
    )


def downgrade() -> None:
    op.drop_table('user_quotas')
    op.drop_index(op.f('ix_dashboard_sessions_user_id'), table_name='dashboard_sessions')
    op.drop_index(op.f('ix_dashboard_sessions_token_id'), table_name='dashboard_sessions')
    op.drop_index(op.f('ix_dashboard_sessions_expires_at'), table_name='dashboard_sessions')
    op.drop_table('dashboard_sessions')
    op.add_column('users', sa.Column('is_admin', sa.Boolean(), nullable=False,
                                     server_default=sa.false()))
    op.execute("UPDATE users SET is_admin = (role = 'admin')")
    op.execute("ALTER TABLE users DROP COLUMN role")
