"""The local stack's Kafka asks every client for a SASL/PLAIN login, on its controller
listener too: a client without one, or with a wrong password, gets nothing; the password
is in no log nor in the connector configuration Kafka Connect keeps and shows."""

from __future__ import annotations

import logging
import socket
import struct

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

pytestmark = pytest.mark.integration

WAIT_S = 5


def list_topics(config: dict) -> tuple[set[str] | None, list[KafkaError]]:
    """The topics a client sees within WAIT_S (None when refused) and its errors."""
    errors: list[KafkaError] = []
    admin = AdminClient({**config, "error_cb": errors.append, "log_level": 0})
    try:
        return set(admin.list_topics(timeout=WAIT_S).topics), errors
    except KafkaException as exc:
        admin.poll(1)  # serves error_cb
        return None, [*errors, exc.args[0]]


def test_a_client_without_the_login_or_with_a_wrong_password_is_refused(stack):
    topics, _ = list_topics(stack.broker.client_config())
    assert topics and f"{stack.s.topic_prefix}.inventory.customers" in topics

    anonymous = {"bootstrap.servers": stack.broker.bootstrap}  # PLAINTEXT, no login
    topics, errors = list_topics(anonymous)
    assert topics is None, "the broker answered a client without a login"

    wrong = {**stack.broker.client_config(), "sasl.password": "not-the-password"}
    topics, errors = list_topics(wrong)
    assert topics is None, "the broker answered a wrong password"
    assert any(e.code() == KafkaError._AUTHENTICATION and "Invalid username or password"
               in e.str() for e in errors), errors  # fmt: skip


def test_a_pipelines_clients_log_a_refused_login_through_python_logging(stack, caplog):
    """librdkafka's lines reach the task's log as records of `cdclake.kafka.client`."""
    from cdclake.config import CLIENT_LOG, KafkaConfig, TimeoutsConfig
    from cdclake.exceptions import EndpointError
    from cdclake.kafka.topics import topic_metadata

    wrong = {k: str(v) for k, v in stack.broker.client_config().items()}
    wrong["sasl.password"] = "not-the-password"
    kafka = KafkaConfig(wrong["bootstrap.servers"], wrong, TimeoutsConfig(2, 3))
    with caplog.at_level(logging.ERROR, logger=CLIENT_LOG.name), pytest.raises(EndpointError):
        with topic_metadata(kafka, timeout=3):
            pass
    said = [r.getMessage() for r in caplog.records if r.name == CLIENT_LOG.name]
    assert any("Invalid username or password" in x for x in said), said


def answers_without_login(port: int) -> bool:
    """Whether the Kafka listener on 127.0.0.1:`port` answers a DescribeCluster request
    (v0, which a KRaft controller serves) sent without a login."""
    client = b"cdclake-test"
    header = struct.pack(">hhih", 60, 0, 7, len(client)) + client + b"\x00"
    request = header + b"\x00\x00"  # no authorized operations, no tagged fields
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT_S) as sock:
        sock.sendall(struct.pack(">i", len(request)) + request)
        try:
            size = sock.recv(4)
            answer = sock.recv(4) if len(size) == 4 else b""
        except (ConnectionResetError, TimeoutError):
            return False
    return answer == struct.pack(">i", 7)  # the response to correlation id 7


def test_the_controller_listener_answers_no_client_without_the_login(stack):
    assert not answers_without_login(stack.broker.controller_port)


def test_the_password_is_in_no_log_nor_in_the_stored_connector_configuration(stack):
    password = stack.broker.password()
    config = stack.connect.request("GET", f"/connectors/{stack.s.topic_prefix}/config")
    assert config["signal.consumer.sasl.mechanism"] == "PLAIN"
    assert config["signal.consumer.sasl.jaas.config"].startswith("${file:")
    assert password not in str(config)
    for log in (stack.broker.logfile, stack.connect.logfile):
        assert password not in log.read_text(errors="replace"), log
    kafka, connect = stack.broker.root, stack.connect.root
    for secret in (kafka / "password", kafka / "server.properties",
                   connect / "kafka-login.properties", connect / "worker.properties"):  # fmt: skip
        assert secret.stat().st_mode & 0o077 == 0, f"{secret} is readable by others"
