"""Alembic environment for assetq.

assetq runs alembic programmatically (assetq.install / assetq.uninstall): the caller's
connection and the namespace arrive in ``config.attributes``. The version table lives inside
the namespace and has a name of its own (``assetq_alembic_version``), so assetq never reads or
writes an application's ``alembic_version``, even when a MySQL user installs assetq into the
application's own database.
"""

from alembic import context

from assetq.migrate import VERSION_TABLE

config = context.config
connection = config.attributes["connection"]
namespace = config.attributes["namespace"]

context.configure(
    connection=connection,
    version_table=VERSION_TABLE,
    version_table_schema=namespace,
    # PostgreSQL runs all revisions in the caller's single transaction; on MySQL DDL commits
    # implicitly anyway, which is why every MySQL script is written to be re-runnable.
    transactional_ddl=connection.dialect.name == "postgresql",
)

with context.begin_transaction():
    context.run_migrations()
