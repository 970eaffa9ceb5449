"""Request and response bodies of the admin API, as published in its OpenAPI schema.

The response models describe the JSON shapes of the public contract (``DeadLetter.to_json()``,
``OutboxStats.to_json()``); the store's ``to_json`` stays the single source of the values, these
models only document and check them. ``extra="allow"`` on the stats shapes lets figures the
stores add later (e.g. a ``published_total`` counter) pass through without an API change.

Every string that reaches the database is checked here first: PostgreSQL text cannot hold a NUL
character and a lone UTF-16 surrogate cannot be encoded, and both would otherwise surface as a
driver error (a 500) instead of a 422 naming the field.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictBool, model_validator

from outboxer.ports import MessageState

__all__ = [
    "BulkResult",
    "ConsumerFailuresOut",
    "DeadLetterFilterBody",
    "DeadLetterOut",
    "DeadLetterPageOut",
    "MessageOut",
    "MessagePageOut",
    "Problem",
    "ReadinessCheck",
    "ReadinessOut",
    "RelayOut",
    "StatsOut",
    "checked_text",
]

MAX_TEXT = 1000  # longer topics/keys/ids are not something an operator types or a store holds
MAX_IDS = 1000  # same ceiling as a page of the list endpoint


def checked_text(value: str) -> str:
    """Refuse text PostgreSQL cannot store (NUL) or UTF-8 cannot encode (lone surrogates)."""
    if "\x00" in value:
        raise ValueError("must not contain NUL characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("must be valid Unicode text (no lone surrogates)") from None
    return value


Text = Annotated[str, Field(min_length=1, max_length=MAX_TEXT), AfterValidator(checked_text)]


class Problem(BaseModel):
    """Every 4xx/5xx answer: ``detail`` names the problem (a string, or a list of field errors)."""

    detail: str | list[dict[str, Any]]


class DeadLetterOut(BaseModel):
    """A dead letter, as ``dlq show --json`` prints it; ``payload`` is JSON, text or base64."""

    id: str
    topic: str
    key: str | None
    type: str | None
    payload: Any
    content_type: str
    headers: dict[str, str]
    created_at: str
    dead_lettered_at: str
    failure_reason: str
    attempts: int
    direction: Literal["publish", "consume"]


class DeadLetterPageOut(BaseModel):
    """One page, newest first; pass ``next_cursor`` as ``cursor`` for the next one."""

    items: list[DeadLetterOut]
    next_cursor: str | None


class MessageOut(BaseModel):
    """A message not yet published and where it stands (``OutboxMessage.to_json()``)."""

    id: str
    topic: str
    key: str | None
    type: str | None
    state: MessageState
    attempts: int
    last_error: str | None
    next_attempt_at: str
    relay: str | None
    lease_expires_at: str | None
    created_at: str
    payload: Any
    content_type: str
    headers: dict[str, str]


class MessagePageOut(BaseModel):
    """One page, oldest first; pass ``next_cursor`` as ``cursor`` for the next one."""

    items: list[MessageOut]
    next_cursor: str | None


class RelayOut(BaseModel):
    """A live relay instance (its heartbeat is recent)."""

    model_config = ConfigDict(extra="allow")

    relay_id: str
    hostname: str
    pid: int
    started_at: str
    heartbeat_at: str
    in_flight: int


class ConsumerFailuresOut(BaseModel):
    """The failed messages one consumer still has to re-drive (``consume_failures``)."""

    model_config = ConfigDict(extra="allow")

    retrying: int = Field(description="its handlers failed; waiting for the next attempt")
    waiting: int = Field(
        description="stored behind an earlier failed message of their key (or replayed), "
        "not tried since"
    )
    oldest_age_seconds: float = Field(description="age of its oldest failure")


class StatsOut(BaseModel):
    """The figures of ``outboxer stats --json``."""

    model_config = ConfigDict(extra="allow")

    pending: int
    in_flight: int
    dead_letters: int
    oldest_pending_age_seconds: float | None
    relays: list[RelayOut]
    last_sweep: dict[str, Any] | None
    consume_failures: dict[str, ConsumerFailuresOut] = Field(
        default_factory=dict,
        description="by consumer name; only consumers with failures are listed",
    )


class BulkResult(BaseModel):
    """What a replay or purge did; the same shape as ``outboxer dlq replay|purge --json``."""

    model_config = ConfigDict(extra="allow")

    count: int
    not_found: list[str] = Field(default_factory=list)


class DeadLetterFilterBody(BaseModel):
    """Which dead letters a bulk replay or purge acts on.

    Exactly one way of choosing must be given, so that acting on *everything* is always
    explicit: ``{"ids": [...]}``, or any of ``topic``/``type``/``key`` (combined with AND), or
    ``{"all": true}``. ``direction`` (``publish``/``consume``) narrows any of them; alone it
    chooses every dead letter of that direction. An empty body or an unknown field is refused
    with 422.
    """

    model_config = ConfigDict(extra="forbid")

    topic: Text | None = None
    type: Text | None = None
    key: Text | None = None
    ids: Annotated[list[Text], Field(min_length=1, max_length=MAX_IDS)] | None = None
    # Strict: "yes", 1 or "on" must not select every dead letter by accident.
    all: StrictBool = False
    direction: Literal["publish", "consume"] | None = None

    @model_validator(mode="after")
    def _one_way_of_choosing(self) -> DeadLetterFilterBody:
        by_filter = any(v is not None for v in (self.topic, self.type, self.key))
        chosen = int(by_filter) + int(self.ids is not None) + int(self.all)
        if chosen == 0 and self.direction is None:
            raise ValueError(
                'choose dead letters: {"ids": [...]}, a filter {"topic"/"type"/"key"/'
                '"direction": ...}, or {"all": true}'
            )
        if chosen > 1:
            raise ValueError('give only one of "ids", a topic/type/key filter, or "all"')
        return self


class ReadinessCheck(BaseModel):
    """One readiness condition and why it holds or not."""

    model_config = ConfigDict(extra="allow")

    ok: bool
    detail: str


class ReadinessOut(BaseModel):
    """``ready`` is true only when every check is ok."""

    ready: bool
    checks: dict[str, ReadinessCheck]
