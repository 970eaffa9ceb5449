"""The one-statement write: the business statement and the outbox INSERT as one statement.

For raw SQL on asyncpg and psycopg (positional and named parameters) and for SQLAlchemy Core
(sync on psycopg, async on asyncpg), on real PostgreSQL: the message lands with the returned
columns filled in and a relay delivers it; the business row and the message commit or roll back
together; an insert that inserts nothing writes no message; every refused value raises before
any SQL and leaves the transaction usable.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, ClassVar

import asyncpg
import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

import outboxer
from outboxer import Returned, message
from outboxer.errors import ConfigurationError, OutboxerError
from outboxer.integrations.sqlalchemy import with_message
from outboxer.message import JSON
from outboxer.stores.postgres import PostgresStore
from tests.conftest import wait_past_commit_gate
from tests.integration.test_write_api import BAD_CALLS, Rollback, circular, delivered_ids

# write(customer, topic, payload, conflict=..., **options) -> the ids the business INSERT returned
Write = Callable[..., Awaitable[list[int]]]


@dataclasses.dataclass
class Shop:
    """A schema with an ``orders`` table and the outbox."""

    url: str
    schema: str
    store: PostgresStore
    kind: Callable[[Shop], contextlib.AbstractAsyncContextManager[Write]]

    def transaction(self) -> contextlib.AbstractAsyncContextManager[Write]:
        """A transaction on a connection of this kind, committed when the block ends."""
        return self.kind(self)

    @property
    def outbox(self) -> outboxer.Outbox:
        return outboxer.Outbox(schema=self.schema)

    def insert_sql(self, placeholder: str, conflict: bool) -> str:
        on_conflict = " ON CONFLICT (customer) DO NOTHING" if conflict else ""
        return (
            f'INSERT INTO "{self.schema}".orders (customer) VALUES ({placeholder})'
            f"{on_conflict} RETURNING id, customer"
        )

    def orders(self) -> sa.Table:
        return sa.Table(
            "orders",
            sa.MetaData(),
            sa.Column("id", sa.BigInteger, primary_key=True),
            sa.Column("customer", sa.Text),
            schema=self.schema,
        )

    def insert(self, customer: str, conflict: bool) -> Any:
        orders = self.orders()
        if conflict:
            return (
                postgresql.insert(orders)
                .values(customer=customer)
                .on_conflict_do_nothing()
                .returning(orders.c.id, orders.c.customer)
            )
        return sa.insert(orders).values(customer=customer).returning(orders.c.id, orders.c.customer)

    async def committed(self) -> tuple[list[tuple[int, str]], list[dict[str, Any]]]:
        """The orders and the outbox rows, each in write order."""
        orders = await self.store.execute(
            f'SELECT id, customer FROM "{self.schema}".orders ORDER BY id'
        )
        messages = await self.store.execute(
            "SELECT id, topic, key, type, payload, content_type, headers::text AS headers, "
            "available_at > now() AS delayed FROM {outbox} ORDER BY seq"
        )
        return [(r["id"], r["customer"]) for r in orders], [
            {**r, "payload": bytes(r["payload"]), "headers": json.loads(r["headers"])}
            for r in messages
        ]


@contextlib.asynccontextmanager
async def asyncpg_raw(shop: Shop) -> AsyncIterator[Write]:
    conn = await asyncpg.connect(shop.url)
    try:
        async with conn.transaction():

            async def write(customer: str, topic: str, payload: object, **options: Any) -> Any:
                conflict = options.pop("conflict", False)
                sql, args = shop.outbox.with_message(
                    shop.insert_sql("$1", conflict),
                    [customer],
                    topic,
                    payload,
                    driver="asyncpg",
                    **options,
                )
                return [r["id"] for r in await conn.fetch(sql, *args)]

            yield write
    finally:
        await conn.close()


@contextlib.asynccontextmanager
async def psycopg_raw(shop: Shop, named: bool = False) -> AsyncIterator[Write]:
    with psycopg.connect(shop.url) as conn, conn.transaction():

        async def write(customer: str, topic: str, payload: object, **options: Any) -> Any:
            conflict = options.pop("conflict", False)
            sql, args = shop.outbox.with_message(
                shop.insert_sql("%(customer)s" if named else "%s", conflict),
                {"customer": customer} if named else [customer],
                topic,
                payload,
                driver="psycopg",
                **options,
            )
            return [r[0] for r in conn.execute(sql, args).fetchall()]

        yield write


@contextlib.asynccontextmanager
async def psycopg_named(shop: Shop) -> AsyncIterator[Write]:
    async with psycopg_raw(shop, named=True) as write:
        yield write


@contextlib.asynccontextmanager
async def sqlalchemy_session(shop: Shop) -> AsyncIterator[Write]:
    engine = sa.create_engine(shop.url.replace("postgresql://", "postgresql+psycopg://"))
    try:
        with Session(engine) as session, session.begin():

            async def write(customer: str, topic: str, payload: object, **options: Any) -> Any:
                statement = shop.insert(customer, options.pop("conflict", False))
                statement = with_message(statement, topic, payload, outbox=shop.outbox, **options)
                return list(session.execute(statement).scalars())

            yield write
    finally:
        engine.dispose()


@contextlib.asynccontextmanager
async def sqlalchemy_async_session(shop: Shop) -> AsyncIterator[Write]:
    engine = create_async_engine(shop.url.replace("postgresql://", "postgresql+asyncpg://"))
    try:
        async with AsyncSession(engine) as session, session.begin():

            async def write(customer: str, topic: str, payload: object, **options: Any) -> Any:
                statement = shop.insert(customer, options.pop("conflict", False))
                statement = with_message(statement, topic, payload, outbox=shop.outbox, **options)
                return list((await session.execute(statement)).scalars())

            yield write
    finally:
        await engine.dispose()


KINDS = [asyncpg_raw, psycopg_raw, psycopg_named, sqlalchemy_session, sqlalchemy_async_session]


@pytest.fixture(params=KINDS, ids=lambda kind: kind.__name__)
async def shop(
    request: pytest.FixtureRequest, pg_url: str, pg_schema: str, pg_store: PostgresStore
) -> Shop:
    await pg_store.execute(
        f'CREATE TABLE "{pg_schema}".orders (id bigserial PRIMARY KEY, customer text UNIQUE)'
    )
    return Shop(pg_url, pg_schema, pg_store, request.param)


async def test_the_message_lands_with_the_returned_columns_and_is_delivered(shop: Shop) -> None:
    when = dt.datetime(2030, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    async with shop.transaction() as write:
        [first] = await write(
            "c-1",
            "orders",
            {"order_id": Returned("id"), "customer": "c-1", "lines": [{"of": Returned("id")}]},
            key=Returned("id"),
            type="OrderCreated",
            headers={"h": "v"},
        )
        [second] = await write("c-2", "orders", {"n": 2}, key="fixed", id="m-2")
        [third] = await write("c-3", "later", "text", available_at=when)
    orders, (created, constant, later) = await shop.committed()
    assert orders == [(first, "c-1"), (second, "c-2"), (third, "c-3")]
    assert (created["topic"], created["key"], created["type"]) == (
        "orders",
        str(first),
        "OrderCreated",
    )
    assert (created["content_type"], created["headers"]) == (JSON, {"h": "v"})
    # the bytes enqueue would write, the database writing the returned values
    expected = f'{{"order_id":{first},"customer":"c-1","lines":[{{"of":{first}}}]}}'
    assert created["payload"] == expected.encode()
    # without returned columns: byte for byte what enqueue writes
    assert (constant["id"], constant["key"], constant["payload"]) == ("m-2", "fixed", b'{"n":2}')
    assert (later["topic"], later["payload"], later["delayed"]) == ("later", b"text", True)
    assert not created["delayed"]
    # the relay delivers what is due
    await wait_past_commit_gate(shop.store)
    assert await delivered_ids(shop.store) == {created["id"], "m-2"}


async def test_the_business_row_and_the_message_roll_back_together(shop: Shop) -> None:
    with contextlib.suppress(Rollback):
        async with shop.transaction() as write:
            assert len(await write("gone", "orders", {"id": Returned("id")})) == 1
            raise Rollback
    assert await shop.committed() == ([], [])


async def test_an_insert_that_inserts_nothing_writes_no_message(shop: Shop) -> None:
    async with shop.transaction() as write:
        [order] = await write("c-1", "orders", {"id": Returned("id")}, conflict=True)
        assert await write("c-1", "orders", {"id": Returned("id")}, conflict=True) == []
    orders, messages = await shop.committed()
    assert orders == [(order, "c-1")]
    assert [json.loads(m["payload"]) for m in messages] == [{"id": order}]


async def test_a_returned_null_is_json_null(shop: Shop) -> None:
    """Found by a probe: ``to_json(NULL)`` is NULL, which made the whole payload NULL, and the
    outbox's NOT NULL refused the business statement itself (the caller's transaction
    aborted): a nullable column in the payload is ordinary."""
    async with shop.transaction() as write:
        payload = {"id": Returned("id"), "who": Returned("customer")}
        [order] = await write(None, "orders", payload)  # type: ignore[arg-type]
    orders, messages = await shop.committed()
    assert orders == [(order, None)]
    assert [json.loads(m["payload"]) for m in messages] == [{"id": order, "who": None}]


REFUSED: list[dict[str, Any]] = [
    *BAD_CALLS,
    {"topic": "t", "payload": {"n": Returned("id"), "x": float("nan")}},
    {"topic": "t", "payload": [Returned("id"), circular()]},
    {"topic": Returned("id"), "payload": {}},
    {"topic": "t", "payload": {}, "type": Returned("id")},
]


async def test_refused_values_raise_before_any_sql(shop: Shop) -> None:
    async with shop.transaction() as write:
        for call in REFUSED:
            with pytest.raises(OutboxerError):
                await write("c-1", **call)
        # on PostgreSQL a failed statement would have aborted the transaction
        [kept] = await write("c-1", "t", {"id": Returned("id")}, key=Returned("id"))
    orders, messages = await shop.committed()
    assert orders == [(kept, "c-1")]
    assert [m["key"] for m in messages] == [str(kept)]


@pytest.mark.parametrize("column", ["", "x" * 64, "a\x00b", 5])
def test_a_returned_column_must_be_a_name_postgresql_keeps(column: Any) -> None:
    with pytest.raises(ConfigurationError, match="Returned"):
        Returned(column)


def test_the_driver_and_its_parameter_style_are_checked() -> None:
    with pytest.raises(ConfigurationError, match="'asyncpg' or 'psycopg'"):
        outboxer.with_message("INSERT ... RETURNING id", [], "t", {}, driver="mysql")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="positional"):
        outboxer.with_message("INSERT ... RETURNING id", {"a": 1}, "t", {}, driver="asyncpg")
    # A caller's parameter named like outboxer's (SQLAlchemy names them after the columns: a
    # column "outboxer_1" made with_message() refuse the table, a probe): outboxer's move aside.
    sql, args = outboxer.with_message(
        "INSERT INTO t (outboxer_1) VALUES (%(outboxer_1)s) RETURNING id",
        {"outboxer_1": "mine"},
        "t",
        {},
        driver="psycopg",
    )
    assert isinstance(args, dict) and args["outboxer_1"] == "mine"
    assert "%(outboxer__1)s::text" in sql and args["outboxer__2"] == "t"  # id, then topic
    assert len(args) == 9  # the caller's and outboxer's eight


def test_parameters_are_numbered_after_the_callers() -> None:
    sql, args = outboxer.with_message(
        "INSERT INTO orders (a, b) VALUES ($1, $2) RETURNING id",
        ["a", "b"],
        "orders",
        {"id": Returned("Order Id"), "n": 1},
        key=Returned("id"),
        id="m",
        driver="asyncpg",
    )
    assert args == ["a", "b", "m", "orders", None, '{"id":', ',"n":1}', JSON, "{}", None]
    assert '$3::text, $4::text, b."id"::text, $5::text, ' in sql
    assert (
        "convert_to($6::text || COALESCE(to_json(b.\"Order Id\")::text, 'null') || $7::text, "
        "'UTF8')" in sql
    )
    assert sql.endswith("SELECT * FROM outboxer_business")


def test_sqlalchemy_needs_returning_and_only_returned_columns() -> None:
    orders = sa.table("orders", sa.column("id"), sa.column("customer"))
    with pytest.raises(ConfigurationError, match="returning"):
        with_message(sa.insert(orders).values(customer="c"), "t", {})
    with pytest.raises(ConfigurationError, match="returning"):
        with_message(sa.select(orders), "t", {})  # type: ignore[arg-type]
    statement = sa.insert(orders).values(customer="c").returning(orders.c.id)
    with pytest.raises(ConfigurationError, match=r"Returned\('customer'\).*\['id'\]"):
        with_message(statement, "t", {}, key=Returned("customer"))


def test_sqlalchemy_refuses_an_orm_class_on_several_tables() -> None:
    """Joined-table inheritance: the ORM sends one INSERT per table, each with the statement's
    options, so each wrote the message; the second failed on its id and aborted the caller's
    transaction (a probe). Refused before any SQL; a class on one table works."""

    class Base(DeclarativeBase):
        pass

    class Employee(Base):
        __tablename__ = "employee"
        id: Mapped[int] = mapped_column(primary_key=True)
        kind: Mapped[str]
        __mapper_args__: ClassVar[dict[str, Any]] = {
            "polymorphic_on": "kind",
            "polymorphic_identity": "employee",
        }

    class Manager(Employee):
        __tablename__ = "manager"
        id: Mapped[int] = mapped_column(sa.ForeignKey("employee.id"), primary_key=True)
        __mapper_args__: ClassVar[dict[str, Any]] = {"polymorphic_identity": "manager"}

    with pytest.raises(ConfigurationError, match="Manager is mapped to several tables"):
        with_message(sa.insert(Manager).returning(Manager.id), "staff", {"id": Returned("id")})
    with pytest.raises(ConfigurationError, match="several tables"):
        with_message(sa.update(Manager).values(kind="x").returning(Manager.id), "staff", {})
    with_message(sa.insert(Employee).returning(Employee.id), "staff", {"id": Returned("id")})


def test_a_payload_cannot_pass_for_a_returned_column() -> None:
    outbox = outboxer.Outbox()
    stand_in = message._TOKEN  # what a column stands as while its payload is encoded
    with pytest.raises(ConfigurationError, match="stand-in"):
        outbox.template("t", {"id": Returned("id"), "x": stand_in})
    # a dataclass payload may hold columns as well
    template = outbox.template("t", Line(Returned("id"), 2))
    assert template.payload_parts == ('{"order":', ',"qty":2}')
    assert template.payload_columns == (Returned("id"),)


@dataclasses.dataclass
class Line:
    order: object
    qty: int


def test_sqlalchemy_elsewhere_than_postgresql_is_refused_before_anything_is_sent(
    tmp_path: Any,
) -> None:
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'shop.db'}")
    orders = sa.Table(
        "orders",
        sa.MetaData(),
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("c", sa.Text),
    )
    orders.create(engine)
    statement = with_message(
        sa.insert(orders).values(c="c-1").returning(orders.c.id), "t", {"id": Returned("id")}
    )
    with engine.begin() as conn, pytest.raises(ConfigurationError, match="on PostgreSQL"):
        conn.execute(statement)
    with engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(orders)).scalar_one() == 0
        # without the message the same statement runs, and the listener leaves it alone
        assert conn.execute(sa.insert(orders).values(c="c-2").returning(orders.c.id)).all()
    engine.dispose()


async def test_sqlalchemy_several_parameter_sets_are_refused(
    pg_url: str, pg_schema: str, pg_store: PostgresStore
) -> None:
    shop = Shop(pg_url, pg_schema, pg_store, sqlalchemy_session)
    orders = shop.orders()
    engine = sa.create_engine(pg_url.replace("postgresql://", "postgresql+psycopg://"))
    try:
        with engine.begin() as conn:
            orders.create(conn)
        statement = with_message(
            sa.insert(orders).returning(orders.c.id), "t", {}, outbox=shop.outbox
        )
        with engine.begin() as conn, pytest.raises(ConfigurationError, match="one set"):
            conn.execute(statement, [{"customer": "a"}, {"customer": "b"}])
        with engine.connect() as conn:
            assert conn.execute(sa.select(sa.func.count()).select_from(orders)).scalar_one() == 0
    finally:
        engine.dispose()


def test_sqlalchemy_marks_a_copy_and_compiles_the_callers_statement() -> None:
    orders = sa.table("orders", sa.column("id"), sa.column("customer"))
    statement = sa.insert(orders).values(customer="c").returning(orders.c.id)
    marked = with_message(statement, "t", {"id": Returned("id")})
    assert "outboxer_message" not in statement.get_execution_options()
    assert str(marked.compile(dialect=postgresql.dialect())) == str(
        statement.compile(dialect=postgresql.dialect())
    )


async def test_a_statement_ending_in_a_semicolon_or_a_comment_is_written(
    pg_url: str, pg_schema: str, pg_store: PostgresStore
) -> None:
    """Found by a probe: a trailing ``;`` ended the statement inside the CTE and a trailing
    ``-- comment`` swallowed the rest of the line: a syntax error that aborted the caller's
    transaction."""
    await pg_store.execute(f'CREATE TABLE "{pg_schema}".orders (id bigserial PRIMARY KEY)')
    await pg_store.execute(
        f'CREATE TABLE "{pg_schema}".dollars (id bigserial PRIMARY KEY, a$b$c int)'
    )
    outbox = outboxer.Outbox(schema=pg_schema)
    insert = f'INSERT INTO "{pg_schema}".orders DEFAULT VALUES RETURNING id'
    conn = await asyncpg.connect(pg_url)
    try:
        async with conn.transaction():
            # (and, a later probe: a ";" followed by a comment)
            endings = (";", " ;\n", " -- a new order", " ; ;", "; -- done", "; /* done */",
                       " /* a /* nested */ */ ; -- b\n")  # fmt: skip
            for ending in endings:
                sql, args = outbox.with_message(
                    insert + ending, [], "orders", {"id": Returned("id")}, driver="asyncpg"
                )
                assert len(await conn.fetch(sql, *args)) == 1
            with pytest.raises(ConfigurationError, match="one statement"):  # before any SQL
                outbox.with_message(
                    insert + "; SELECT 1", [], "orders", {"id": Returned("id")}, driver="asyncpg"
                )
            quoted = insert.replace("DEFAULT VALUES", "VALUES (DEFAULT)") + " -- ';' $$"
            # (a probe of the scanner: '$' inside a name, a word ending in E before a quote)
            dollars = f'INSERT INTO "{pg_schema}".dollars (a$b$c)'
            for statement in (
                quoted,
                f"{dollars} VALUES (1) RETURNING id;",
                f"{dollars} SELECT 2 WHERE 'a%' LIKE 'a\\%' ESCAPE'\\' RETURNING id; -- done",
            ):
                sql, args = outbox.with_message(
                    statement, [], "o", {"id": Returned("id")}, driver="asyncpg"
                )
                assert len(await conn.fetch(sql, *args)) == 1
    finally:
        await conn.close()
    assert len(await pg_store.execute("SELECT id FROM {outbox}")) == 10


def test_sqlalchemy_returned_takes_a_columns_key_or_its_name() -> None:
    """Found by a probe: with ``Column("id", key="order_id")``, ``Returned("order_id")`` passed
    the check and failed in the database (the CTE reads SQL names), ``Returned("id")`` was
    refused. Both name the column now, as the SQL names it."""
    orders = sa.Table(
        "orders", sa.MetaData(), sa.Column("id", sa.BigInteger, primary_key=True, key="order_id")
    )
    statement = sa.insert(orders).values().returning(orders.c.order_id)
    for column in ("order_id", "id"):
        marked = with_message(statement, "t", {"n": Returned(column)}, key=Returned(column))
        _, template = marked.get_execution_options()["outboxer_message"]
        assert template.key.column == "id"
        assert [c.column for c in template.payload_columns] == ["id"]
    with pytest.raises(OutboxerError, match="Returned\\('nope'\\)"):
        with_message(statement, "t", {"n": Returned("nope")})
