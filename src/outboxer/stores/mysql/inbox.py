"""The inbox on MySQL: its tables exist (schema version 3); its SQL primitives
(:class:`~outboxer.ports.InboxTransaction`, see ``stores/postgres/inbox.py``) are still to be
written, so until then consuming refuses loudly.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import NoReturn

from outboxer.errors import ConfigurationError
from outboxer.ports import InboxSession

__all__ = ["MysqlInbox"]


def _not_ready() -> NoReturn:
    raise ConfigurationError("the inbox (outboxer consume) is not available on MySQL/MariaDB yet")


class MysqlInbox:
    """The inbox port (:class:`~outboxer.ports.InboxStore`): not available yet (see above)."""

    def inbox_session(self) -> AbstractAsyncContextManager[InboxSession]:
        _not_ready()
