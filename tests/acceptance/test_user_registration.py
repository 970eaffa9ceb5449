"""The user-registration example end to end: PostgreSQL → relay → RabbitMQ → consumer → SMTP.

Real processes: ``outboxer relay`` and ``outboxer consume`` run as subprocesses, the welcome
e-mails go over SMTP to a local aiosmtpd server run by the test. Each user must get exactly one
e-mail when

- the message is delivered twice (the test publishes it again with the same id),
- the handler fails once (the SMTP server refuses the first attempt with a temporary 451),
- the consumer is killed (SIGKILL) after a user's e-mail was sent and committed but before the
  broker acknowledgement (another message of the same batch is stuck in SMTP at that moment).
"""

from __future__ import annotations

import asyncio
import email
import email.policy
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pika  # type: ignore[import-untyped]
import pytest
from aiosmtpd.controller import Controller
from examples.user_registration import app

from outboxer.brokers.rabbitmq.publisher import RabbitMQPublisher
from outboxer.message import Message
from outboxer.stores.postgres import PostgresStore
from tests.acceptance.conftest import OUTBOXER, PYTHONPATH
from tests.acceptance.processes import Process, wait
from tests.conftest import require_service, unique_name
from tests.tansu import free_port

pytestmark = pytest.mark.timeout(120)

AMQP = "amqp://guest:guest@127.0.0.1:5672/"


class MailServer:
    """An SMTP server that records mails and misbehaves on purpose for some recipients.

    ``fail-once@…``: the first RCPT TO is refused with ``451`` (temporary), later ones pass.
    ``stuck@…``: the first RCPT TO hangs until :attr:`release` is set (the test kills the
    sending consumer meanwhile, so that mail never arrives).
    """

    def __init__(self) -> None:
        self.mails: list[email.message.EmailMessage] = []
        self.refused: set[str] = set()
        self.stuck = threading.Event()
        self.release = threading.Event()
        self._lock = threading.Lock()

    async def handle_RCPT(
        self, server: Any, session: Any, envelope: Any, address: str, options: Any
    ) -> str:
        if address.startswith("fail-once@") and address not in self.refused:
            self.refused.add(address)
            return "451 4.3.0 try again later"
        if address.startswith("stuck@") and not self.release.is_set():
            self.stuck.set()
            while not self.release.is_set():
                await asyncio.sleep(0.02)
            return "451 4.3.0 the client went away"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        mail = email.message_from_bytes(envelope.content, policy=email.policy.default)
        with self._lock:
            self.mails.append(mail)  # type: ignore[arg-type]
        return "250 Message accepted for delivery"

    def to(self, address: str) -> list[email.message.EmailMessage]:
        with self._lock:
            return [m for m in self.mails if m["To"] == address]


@pytest.fixture
def smtp() -> Iterator[tuple[MailServer, int]]:
    server = MailServer()
    port = free_port()
    controller = Controller(server, hostname="127.0.0.1", port=port)
    controller.start()
    try:
        yield server, port
    finally:
        server.release.set()
        controller.stop()


def queue_depth(queue: str) -> int:
    connection = pika.BlockingConnection(pika.URLParameters(AMQP))
    try:
        ok = connection.channel().queue_declare(queue, passive=True)
        return int(ok.method.message_count)
    finally:
        connection.close()


def delete_queue(queue: str, exchange: str) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(AMQP))
    try:
        channel = connection.channel()
        channel.queue_delete(queue)
        channel.exchange_delete(exchange)
    finally:
        connection.close()


async def test_every_user_gets_exactly_one_welcome_email(
    pg_url: str,
    pg_schema: str,
    pg_store: PostgresStore,
    smtp: tuple[MailServer, int],
    tmp_path: Path,
) -> None:
    require_service("RabbitMQ", "127.0.0.1", 5672)
    mail, smtp_port = smtp
    exchange, consumer = unique_name("users"), unique_name("welcome")
    broker = f"{AMQP}?exchange={exchange}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOXER_")}
    env.update(
        PYTHONPATH=PYTHONPATH,
        SMTP_PORT=str(smtp_port),
        EXAMPLE_SCHEMA=pg_schema,
        DATABASE_URL=pg_url,
    )
    database = ["--database-url", pg_url, "--schema", pg_schema]
    consume = [
        "--log-level",
        "INFO",
        "consume",
        *database,
        "--broker",
        broker,
        "--handlers",
        "examples.user_registration.handlers:registry",
        "--consumer-name",
        consumer,
        "--topic",
        app.TOPIC,
        "--retry-base",
        "0.2",
        "--retry-interval",
        "0.1",
        "--sweep-interval",
        "0",
    ]

    async def register(*users: tuple[str, str]) -> dict[str, str]:
        conn = await asyncpg.connect(pg_url)
        try:
            await app.create_tables(conn, pg_schema)
            ids = {}
            for address, name in users:
                _, ids[address] = await app.register_user(conn, address, name, schema=pg_schema)
            return ids
        finally:
            await conn.close()

    async def outbox_empty() -> bool:
        return (await pg_store.stats()).pending == 0

    async def inbox_has(message_id: str) -> bool:
        rows = await pg_store.execute(
            "SELECT 1 FROM {inbox} WHERE consumer = $1 AND message_id = $2", consumer, message_id
        )
        return bool(rows)

    relay = Process(
        [OUTBOXER, "relay", *database, "--broker", broker, "--poll-interval", "0.1"],
        env,
        tmp_path / "relay.log",
    )
    first = Process([OUTBOXER, *consume], env, tmp_path / "consumer-1.log")
    consumers = [first]
    try:
        # The consumer declares its queue and binding; only then is anything routed to it.
        await wait(lambda: "consuming queue" in first.output(), "the consumer's queue")

        # 1. Delivered twice, and failing once.
        ids = await register(("alice@example.com", "Alice"), ("fail-once@example.com", "Bo"))
        await wait(lambda: len(mail.to("alice@example.com")) == 1, "alice's mail")
        await wait(lambda: len(mail.to("fail-once@example.com")) == 1, "the retried mail")
        assert "fail-once@example.com" in mail.refused  # the first attempt really failed
        [alice_mail] = mail.to("alice@example.com")
        assert alice_mail["Message-ID"] == f"<{ids['alice@example.com']}@outboxer>"
        await _publish_again(broker, alice_mail, pg_url, pg_schema)
        await wait(lambda: queue_depth(consumer) == 0, "the duplicate to be consumed")
        assert first.stop() == 0, first.output()[-3000:]
        assert first.counters()["duplicate"] >= 1
        assert first.counters()["retrying"] == 1

        # 2. Killed between sending and acknowledging: carol's mail is sent and her inbox row
        #    committed while stuck@'s mail (same batch) hangs in SMTP; then SIGKILL.
        ids = await register(("carol@example.com", "Carol"), ("stuck@example.com", "Dee"))
        await wait(outbox_empty, "the relay to publish both")
        await wait(lambda: queue_depth(consumer) == 2, "both messages to be queued")
        second = Process([OUTBOXER, *consume], env, tmp_path / "consumer-2.log")
        consumers.append(second)
        await wait(lambda: len(mail.to("carol@example.com")) == 1, "carol's mail")
        await wait(lambda: inbox_has(ids["carol@example.com"]), "carol's inbox row")
        await wait(mail.stuck.is_set, "the stuck mail")
        second.kill()
        mail.release.set()
        assert queue_depth(consumer) == 2  # neither was acknowledged: both come back

        third = Process([OUTBOXER, *consume], env, tmp_path / "consumer-3.log")
        consumers.append(third)
        await wait(lambda: len(mail.to("stuck@example.com")) == 1, "the stuck user's mail")
        await wait(lambda: queue_depth(consumer) == 0, "the queue to drain")
        assert third.stop() == 0, third.output()[-3000:]
        assert third.counters()["duplicate"] == 1  # carol's redelivery, dropped by the inbox

        for address in ("alice@", "fail-once@", "carol@", "stuck@"):
            assert len(mail.to(f"{address}example.com")) == 1, address
        welcomed = await _welcomed(pg_url, pg_schema)
        assert welcomed == {
            "alice@example.com",
            "fail-once@example.com",
            "carol@example.com",
            "stuck@example.com",
        }
    except BaseException:
        for process in (relay, *consumers):
            print(process.log.name, process.output()[-4000:])
        raise
    finally:
        for process in consumers:
            if process.process.poll() is None:
                process.kill()
        relay.stop()
        delete_queue(consumer, exchange)


async def _welcomed(url: str, schema: str) -> set[str]:
    conn = await asyncpg.connect(url)
    try:
        rows = await conn.fetch(f'SELECT email FROM "{schema}".users WHERE welcomed_at IS NOT NULL')
        return {r[0] for r in rows}
    finally:
        await conn.close()


async def _publish_again(
    broker: str, received: email.message.EmailMessage, url: str, schema: str
) -> None:
    """Publish alice's UserRegistered once more, with the same id: a broker-level duplicate."""
    message_id = received["X-Outbox-Message-Id"]
    conn = await asyncpg.connect(url)
    try:
        user = await conn.fetchrow(
            f'SELECT id, email, name FROM "{schema}".users WHERE email = $1', received["To"]
        )
    finally:
        await conn.close()
    assert user is not None
    payload = {"user_id": user["id"], "email": user["email"], "name": user["name"]}
    again = Message(
        id=message_id,
        topic=app.TOPIC,
        payload=json.dumps(payload).encode(),
        key=str(user["id"]),
        type="UserRegistered",
    )
    async with RabbitMQPublisher.from_url(broker) as publisher:
        assert list(await publisher.publish([again])) == [None]
