"""Print the order events arriving on Kafka, dropping duplicates by their ``ce_id``.

The relay delivers at least once: after a crash a message may arrive twice, always with the same
``ce_id`` (the outbox message id). A real consumer records the ids it has handled in the same
transaction as its effects (outboxer's inbox does exactly that); this one keeps them in memory.

    python examples/order_pipeline/print_events.py --bootstrap 127.0.0.1:9092 [--prefix orders]
        [--group order-printer] [--max-events N] [--json]

It subscribes to every topic ``<prefix>.<region>`` (a regular expression subscription, so
regions created later are picked up) in a consumer group, from the earliest offset the group
has not consumed yet. ``--json`` prints one JSON object per event, for scripts and tests.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import sys
import time
from typing import Any

from confluent_kafka import Consumer, KafkaError, Message


def parse_event(record: Message) -> dict[str, Any]:
    headers = {name: (value or b"").decode() for name, value in record.headers() or []}
    payload: Any = record.value() or b""
    if headers.get("content-type", "").startswith("application/json"):
        payload = json.loads(payload)
    key = record.key()
    return {
        "id": headers.get("ce_id"),
        "type": headers.get("ce_type"),
        "time": headers.get("ce_time"),
        "topic": record.topic(),
        "partition": record.partition(),
        "offset": record.offset(),
        "key": key.decode() if key is not None else None,
        "traceparent": headers.get("traceparent"),
        "payload": payload,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", default="127.0.0.1:9092", help="Kafka host:port")
    parser.add_argument("--prefix", default="orders", help="topic prefix (default: orders)")
    parser.add_argument("--group", default="order-printer", help="consumer group id")
    parser.add_argument("--max-events", type=int, default=0, help="stop after N (0: never)")
    parser.add_argument("--timeout", type=float, default=0, help="stop after S seconds idle")
    parser.add_argument("--json", action="store_true", help="one JSON object per event")
    args = parser.parse_args(argv)

    consumer = Consumer(
        {
            "bootstrap.servers": args.bootstrap,
            "group.id": args.group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": True,
            # Fast group joins (a single consumer; also what Tansu needs to answer promptly).
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 500,
            "topic.metadata.refresh.interval.ms": 2000,  # see new region topics soon
        }
    )
    consumer.subscribe([f"^{re.escape(args.prefix)}\\..+"])
    stop = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
    seen: set[str] = set()
    printed = 0
    idle_since = time.monotonic()
    try:
        while not stop["now"]:
            record = consumer.poll(0.5)
            if record is None:
                if args.timeout and time.monotonic() - idle_since > args.timeout:
                    break
                continue
            error = record.error()
            if error is not None:
                if error.code() != KafkaError._PARTITION_EOF:  # noqa: SLF001 - the public name
                    print(f"kafka: {error}", file=sys.stderr)
                continue
            idle_since = time.monotonic()
            event = parse_event(record)
            duplicate = event["id"] in seen
            seen.add(event["id"])
            if args.json:
                print(json.dumps({**event, "duplicate": duplicate}), flush=True)
            else:
                mark = " (duplicate, ignored)" if duplicate else ""
                payload = event["payload"]
                total = payload.get("total") if isinstance(payload, dict) else None
                print(
                    f"{event['type']} order={event['key']} total={total} "
                    f"topic={event['topic']}[{event['partition']}]@{event['offset']} "
                    f"id={event['id']}{mark}",
                    flush=True,
                )
            if not duplicate:
                printed += 1
                if args.max_events and printed >= args.max_events:
                    break
    except KeyboardInterrupt:
        pass
    finally:
        consumer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
