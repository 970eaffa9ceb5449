"""The services the suite talks to, and the command that starts each one.

``python tests/services.py`` (run by ``make test`` before pytest) starts any that is not
listening with that command and waits until it answers. The commands are the ones this
machine's services were started with; a service started by a command of a session is
stopped with that session, so the next run on the same machine may find it down.
Tests never start a service themselves: a test that finds one down fails with its command
(:func:`tests.conftest.require_service`).
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time

#: name → (port on 127.0.0.1, the shell command that starts it).
SERVICES = {
    "PostgreSQL": (
        5432,
        "pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start",
    ),
    "MariaDB": (3306, "start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd"),
    "Redis": (
        6379,
        'redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" '
        "--appendonly no --dir /var/lib/redis --logfile /var/log/redis/ci.log",
    ),
    "RabbitMQ": (5672, "rabbitmq-server -detached"),
    "NATS": (
        4222,
        "start-stop-daemon --start --oknodo --background --exec /usr/sbin/nats-server -- "
        "-a 127.0.0.1 -p 4222 -js -sd /var/lib/nats-server -l /var/log/nats-server.log",
    ),
}

START = {name: command for name, (_, command) in SERVICES.items()}


def listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            return True
    except OSError:
        return False


def ensure(timeout: float = 120.0) -> int:
    """Start every service that is down; 0 once all listen, 1 (with the reason) otherwise."""
    down = {name: port for name, (port, _) in SERVICES.items() if not listening(port)}
    for name in down:
        print(f"services: {name} is down; starting it: {START[name]}", flush=True)
        # A start command that keeps running is no failure: whether it listens decides below.
        with contextlib.suppress(subprocess.TimeoutExpired):
            subprocess.run(START[name], shell=True, check=False, timeout=timeout)
    deadline = time.monotonic() + timeout
    while down:
        down = {name: port for name, port in down.items() if not listening(port)}
        if down and time.monotonic() > deadline:
            for name in down:
                print(f"services: {name} did not start with: {START[name]}", file=sys.stderr)
            return 1
        time.sleep(0.5)
    return 0


if __name__ == "__main__":
    sys.exit(ensure())
