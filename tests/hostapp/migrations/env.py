"""The host application's alembic environment: an ordinary env.py, plus assetq's filter for
autogenerate. HOSTAPP_NO_ASSETQ_FILTER=1 leaves the filter out (the test shows what
autogenerate proposes then). HOSTAPP_ASSETQ_REVISIONS=<folder> adds the assetq revisions of
that folder after the package's own (the tests give tests/revisions: test-only table steps
that stand for a newer assetq package, whose head is after the baseline). A test fixture's
switch: no application needs it, and assetq itself reads no environment variable for it."""

import os

import sqlalchemy as sa
from alembic import context

import assetq.alembic
import assetq.migrate

NAMESPACE = os.environ.get("HOSTAPP_ASSETQ_NAMESPACE", "assetq")
URL = os.environ["HOSTAPP_DATABASE_URL"]

if os.environ.get("HOSTAPP_ASSETQ_REVISIONS"):
    assetq.migrate.use_revisions(os.environ["HOSTAPP_ASSETQ_REVISIONS"])

metadata = sa.MetaData()
sa.Table(
    "account",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("name", sa.String(100), nullable=False),
    sa.Column("email", sa.String(200), nullable=True),
)
sa.Table(
    "orders",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("account_id", sa.Integer, sa.ForeignKey("account.id"), nullable=False),
    sa.Column("amount", sa.Integer, nullable=False),
    sa.Index("orders_amount_idx", "amount"),
)


def include_object(obj, name, type_, reflected, compare_to):  # type: ignore[no-untyped-def]
    if os.environ.get("HOSTAPP_NO_ASSETQ_FILTER"):
        return True
    return assetq.alembic.include_object(
        obj, name, type_, reflected, compare_to, namespace=NAMESPACE
    )


options = {
    "target_metadata": metadata,
    "include_object": include_object,
    # PostgreSQL: compare every schema, assetq's too (its filter keeps it out). Not on
    # MySQL, where every database of the server would be a schema.
    "include_schemas": URL.startswith("postgresql"),
}

if context.is_offline_mode():
    context.configure(url=URL, literal_binds=True, **options)
    with context.begin_transaction():
        context.run_migrations()
else:
    engine = sa.create_engine(URL, poolclass=sa.NullPool)
    with engine.connect() as connection:
        context.configure(connection=connection, **options)
        with context.begin_transaction():
            context.run_migrations()
