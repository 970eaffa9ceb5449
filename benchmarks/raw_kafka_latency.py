"""Produce → delivery-report latency of confluent-kafka alone at 1,000 msg/s against Tansu.

The reference for ``benchmarks.latency``'s Kafka row: no database, no outboxer code, the same
producer settings as the Kafka publisher (idempotent, acks=all, linger.ms=0).

Run: ``.venv/bin/python -m benchmarks.raw_kafka_latency``
"""

from __future__ import annotations

import statistics
import time

from confluent_kafka import Producer
from tests.tansu import TansuBroker, create_topic

RATE, COUNT = 1000, 8000


def main() -> None:
    broker = TansuBroker().start()
    try:
        create_topic(broker.bootstrap, "latency", 3)
        producer = Producer(
            {
                "bootstrap.servers": broker.bootstrap,
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 0,
            }
        )
        latencies: list[float] = []
        start = time.perf_counter()
        for n in range(COUNT):
            due = start + n / RATE
            while (left := due - time.perf_counter()) > 0:
                producer.poll(min(0.0005, left))
            sent = time.perf_counter()
            producer.produce(
                "latency",
                b"x" * 120,
                key=str(n % 1000),
                on_delivery=lambda err, msg, sent=sent: latencies.append(
                    (time.perf_counter() - sent) * 1000
                ),
            )
        producer.flush(10)
    finally:
        broker.stop()
    latencies.sort()
    print(
        f"raw confluent-kafka → Tansu at {RATE} msg/s: p50 {statistics.median(latencies):.2f} ms"
        f"  p99 {latencies[int(len(latencies) * 0.99)]:.2f} ms  max {latencies[-1]:.2f} ms"
    )


if __name__ == "__main__":
    main()
