"""librdkafka's lines reach Python's logging through `CLIENT_LOG`, but for the one a
consumer's closing group-coordinator connection writes under SASL."""

from __future__ import annotations

import logging

import pytest

TEARDOWN = (
    "FAIL [rdkafka#consumer-1] [thrd:GroupCoordinator]: GroupCoordinator: SASL authentication "
    "error: SaslAuthenticateRequest failed: Local: Broker transport failure (after 0ms in "
    "state DOWN)"
)
WRONG_PASSWORD = (
    "FAIL [rdkafka#consumer-1] [thrd:sasl_plaintext://127.0.0.1:19092/bootstrap]: "
    "sasl_plaintext://127.0.0.1:19092/bootstrap: SASL authentication error: Authentication "
    "failed: Invalid username or password (after 301ms in state AUTH_REQ)"
)
BROKER_DOWN = (
    "FAIL [rdkafka#consumer-1] [thrd:GroupCoordinator]: GroupCoordinator: 127.0.0.1:19092: "
    "Connect to ipv4#127.0.0.1:19092 failed: Connection refused (after 0ms in state CONNECT)"
)


@pytest.mark.parametrize(("line", "kept"), [(TEARDOWN, False), (WRONG_PASSWORD, True),
                                            (BROKER_DOWN, True)])  # fmt: skip
def test_only_the_closing_coordinators_line_is_dropped(caplog, line, kept):
    from cdclake.config import CLIENT_LOG

    with caplog.at_level(logging.DEBUG, logger=CLIENT_LOG.name):
        CLIENT_LOG.error("%s", line)
    assert [r.getMessage() for r in caplog.records] == ([line] if kept else [])


def test_every_client_logs_through_it():
    from cdclake.config import CLIENT_LOG, KafkaConfig

    config = KafkaConfig("127.0.0.1:1", {"security.protocol": "SASL_PLAINTEXT"})
    assert config.client_config()["logger"] is CLIENT_LOG
    assert config.servers == "127.0.0.1:1"
