"""A call that owns its transactions retries a lost connection at most
api.CONNECTION_ATTEMPTS times, whatever its max_attempts: a large conflict budget (50 on
Galera, docs/deployment.md) must not keep a scheduler inside one pass while its server is
gone, deaf to its stop request."""

from __future__ import annotations

import logging

import pytest
import sqlalchemy as sa

import assetq
from assetq import api
from dbs import TestDatabase
from servers import free_port


@pytest.mark.parametrize("call", ["schedule", "claim_runs"])
def test_a_server_that_is_gone_is_given_up_after_the_connection_budget(
    db: TestDatabase, caplog: pytest.LogCaptureFixture, call: str
) -> None:
    # The test database's URL with a port nothing listens on: every connect is refused.
    engine = sa.create_engine(db.url.set(host="127.0.0.1", port=free_port(), query={}))
    # The first retry of an outage is a WARNING, the others DEBUG.
    caplog.set_level(logging.DEBUG, logger="assetq")
    try:
        with pytest.raises(assetq.ConnectionLost):
            if call == "schedule":
                assetq.schedule(engine, max_attempts=50)
            else:
                assetq.claim_runs(engine, "w", max_attempts=50)
    finally:
        engine.dispose()
    retries = [r for r in caplog.records if "retrying in" in r.getMessage()]
    assert len(retries) == api.CONNECTION_ATTEMPTS - 1
