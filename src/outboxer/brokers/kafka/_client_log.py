"""librdkafka's own log lines, routed to Python logging without the reconnect noise.

While a broker is down librdkafka retries the connection several times a second and logs every
failure at ERROR (facility ``FAIL``, "Connect to ... failed: Connection refused"): hundreds of
lines a minute that say nothing the relay's own outage line ("broker unavailable ... pausing",
then "broker is back") does not. Those lines are demoted to DEBUG here; every other line keeps
its level.
"""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from typing import Any

__all__ = ["client_log"]

#: librdkafka facilities of connection attempts and disconnects.
_CONNECTION_FACILITIES = frozenset({"FAIL", "CONNECT", "BROKERFAIL", "DISCONNECT"})


class _QuietClientLog(logging.LoggerAdapter[logging.Logger]):
    """Called by librdkafka as ``log(level, "%s [%s] %s", facility, client, text)``."""

    def log(self, level: int, msg: object, *args: Any, **kwargs: Any) -> None:
        if args and args[0] in _CONNECTION_FACILITIES and level > logging.DEBUG:
            level = logging.DEBUG
        self.logger.log(level, msg, *args, **kwargs)

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, Any]:
        return msg, kwargs


def client_log(name: str) -> logging.LoggerAdapter[logging.Logger]:
    """The logger to pass as librdkafka's ``logger`` property."""
    return _QuietClientLog(logging.getLogger(name), {})
