"""Alembic environment for assetq.

assetq runs alembic programmatically (assetq.install / assetq.uninstall, assetq.alembic from a
host application's own revisions, ``assetq sql``): the caller's connection (None offline),
the namespace and the engine's name arrive in ``config.attributes``. The version table lives
inside the namespace and has a name of its own (``assetq_alembic_version``), so assetq never
reads or writes an application's ``alembic_version``, even when a MySQL user installs assetq
into the application's own database.
"""

from alembic import context

from assetq.migrate import version_table

config = context.config
connection = config.attributes["connection"]
namespace = config.attributes["namespace"]
# A MySQL namespace with a table prefix (appdb.assetq_) names the table with it, in its database.
version_table_schema, version_table_name = version_table(namespace)

if context.is_offline_mode():
    # SQL text (``assetq sql``, a host's ``alembic upgrade --sql``), written to the config's
    # output buffer. No BEGIN/COMMIT here: the caller writes them once around everything.
    context.configure(
        dialect_name=config.attributes["dialect_name"],
        version_table=version_table_name,
        version_table_schema=version_table_schema,
        transactional_ddl=False,
        literal_binds=True,
    )
else:
    context.configure(
        connection=connection,
        version_table=version_table_name,
        version_table_schema=version_table_schema,
        # PostgreSQL runs all revisions in the caller's single transaction (alembic leaves a
        # transaction the caller began alone); on MySQL DDL commits implicitly anyway, which
        # is why every MySQL script is written to be re-runnable.
        transactional_ddl=connection.dialect.name == "postgresql",
    )

with context.begin_transaction():
    context.run_migrations()
