"""Alembic environment for assetq.

assetq runs alembic programmatically (assetq.install / assetq.uninstall): the caller's
connection and the namespace arrive in ``config.attributes``. The version table lives inside
the namespace, so assetq never reads or writes an application's own ``alembic_version``.
"""

from alembic import context

config = context.config
connection = config.attributes["connection"]
namespace = config.attributes["namespace"]

context.configure(
    connection=connection,
    version_table="alembic_version",
    version_table_schema=namespace,
    # PostgreSQL runs all revisions in the caller's single transaction; on MySQL DDL commits
    # implicitly anyway, which is why every MySQL script is written to be re-runnable.
    transactional_ddl=connection.dialect.name == "postgresql",
)

with context.begin_transaction():
    context.run_migrations()
