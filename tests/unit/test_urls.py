"""The one URL grammar: typed options, hosts, paths, secrets kept out of every error."""

from __future__ import annotations

import pytest

from outboxer.errors import ConfigurationError
from outboxer.urls import SCHEMES, Option, UrlSpec, lookup, parse, redact, safe_url, scheme_of

SPEC = UrlSpec(
    what="test URL",
    schemes=("tst",),
    hosts="many",
    default_port=1234,
    path="optional",
    options=(
        Option("n", "int", 5, minimum=1, maximum=10),
        Option("x", "float", 1.5, minimum=0),
        Option("flag", "bool", False),
        Option("mode", choices=("Fast", "slow"), default="slow"),
        Option("token", secret=True),
    ),
    example="tst://host:1234",
)


def test_hosts_ports_path_credentials_and_typed_defaults() -> None:
    url = parse("tst://us%40er:p%2Fa:ss@a:1,[::1]:2,b/some%20path?n=7&flag=yes&mode=FAST", SPEC)
    assert url.scheme == "tst"
    assert (url.username, url.password) == ("us@er", "p/a:ss")
    assert url.hosts == (("a", 1), ("::1", 2), ("b", 1234))
    assert url.netloc() == "a:1,[::1]:2,b:1234"
    assert url.path == "some path"
    assert url.options == {"n": 7, "x": 1.5, "flag": True, "mode": "Fast", "token": None}
    assert url.given == {"n", "flag", "mode"}
    assert "p/a:ss" not in repr(url)


def test_password_with_slash_is_never_shown() -> None:
    url = parse("tst://user:se/cr/et@host:9/db", SPEC)
    assert url.password == "se/cr/et"
    assert url.host == "host" and url.port == 9 and url.path == "db"
    assert "se/cr/et" not in url.redacted()


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("tst://h:abc", "port 'abc'"),
        ("tst://h:99999", "port '99999'"),
        ("tst://h:0", "port '0'"),
        ("tst://[::1", "malformed IPv6"),
        ("tst://[zz::1]:5", "malformed IPv6"),
        ("tst://h?nope=1", "unknown option 'nope'; known options: n, x, flag, mode, token"),
        ("tst://h?n=1&n=2", "option 'n' is given more than once"),
        ("tst://h?n=11", "n='11' is out of range (1 to 10)"),
        ("tst://h?n=1.5", "n='1.5' is not an integer"),
        ("tst://h?x=nan", "must be a finite number"),
        ("tst://h?x=inf", "must be a finite number"),
        ("tst://h?x=1e400", "must be a finite number"),
        ("tst://h?flag=maybe", "flag='maybe': use true or false"),
        ("tst://h?mode=warp", "mode='warp' is not one of Fast, slow"),
        ("tst://h?token=abc&token=d", "given more than once"),
        ("tst://h?token=", "given"),
        ("tst://h#frag", "#fragment"),
        ("nope://h", "scheme nope:// is not accepted"),
        ("tst:/user:pw@h", "expected tst://"),
        ("", "empty URL"),
        (" tst://h", "spaces"),
        ("tst://h/\x00", "control characters"),
    ],
)
def test_bad_urls_get_one_line_without_the_secret(url: str, expected: str) -> None:
    if expected == "given":  # an empty secret is a valid (empty) value
        assert parse(url, SPEC).options["token"] == ""
        return
    with pytest.raises(ConfigurationError) as caught:
        parse(url, SPEC)
    message = str(caught.value)
    assert expected in message
    assert "\n" not in message
    assert message.startswith("test URL: ")


def test_secret_option_value_is_masked_in_errors() -> None:
    spec = UrlSpec("s URL", ("s",), options=(Option("key", "int", secret=True),))
    with pytest.raises(ConfigurationError) as caught:
        parse("s://h?key=hunter2", spec)
    assert "hunter2" not in str(caught.value)


def test_hostless_and_opaque_urls() -> None:
    sqlite = UrlSpec("sqlite URL", ("sqlite",), hosts="none", path="required", credentials=False)
    assert parse("sqlite:///tmp/x.db", sqlite).path == "tmp/x.db"
    assert parse("sqlite:////abs/x.db", sqlite).path == "/abs/x.db"
    with pytest.raises(ConfigurationError, match="no host is allowed") as caught:
        parse("sqlite://user:pw@host/x.db", sqlite)
    assert "pw" not in str(caught.value)
    opaque = UrlSpec("inprocess URL", ("inprocess",), hosts="opaque")
    assert parse("inprocess://pkg.mod:registry", opaque).authority == "pkg.mod:registry"


def test_one_host_only_when_declared() -> None:
    one = UrlSpec("one URL", ("o",))
    with pytest.raises(ConfigurationError, match="only one host"):
        parse("o://a,b", one)


@pytest.mark.parametrize(
    "text",
    [
        "postgresql://user:hunter2@db/app",
        "postgresql:/user:hunter2@db/app",
        "postgresql://user:hun/ter2@db/app",
        "error connecting to 'amqp://guest:hunter2@[::1]:5672/%2f' failed",
        "redis://:hunter2@localhost:6379/0",
        "http://h/x?token=hunter2&a=1",
        "Authorization: Bearer hunter2",
    ],
)
def test_redact_masks_every_form(text: str) -> None:
    assert "hunter2" not in redact(text)


def test_scheme_registry() -> None:
    assert scheme_of("postgresql+asyncpg://x") == "postgresql"
    assert scheme_of("KAFKA://x") == "kafka"
    assert scheme_of("no scheme") == ""
    assert lookup("mariadb://h/db", "database").name == "mysql"
    assert lookup("amqps://h", "broker").name == "rabbitmq"
    with pytest.raises(ConfigurationError, match="unsupported database URL kafka://"):
        lookup("kafka://h:9092", "database")
    with pytest.raises(ConfigurationError) as caught:
        lookup("bogus://u:hunter2@h", "broker")
    assert "hunter2" not in str(caught.value)
    assert {entry.kind for entry in SCHEMES.values()} == {"database", "broker"}


def test_default_host_and_ports_per_scheme() -> None:
    amqp = UrlSpec(
        "amqp URL",
        ("amqp", "amqps"),
        default_port={"amqp": 5672, "amqps": 5671},
        default_host="localhost",
        path="optional",
    )
    assert parse("amqp://", amqp).hosts == (("localhost", 5672),)
    assert parse("amqps://h/vh", amqp).hosts == (("h", 5671),)
    required = UrlSpec("k URL", ("k",), hosts="many", default_port=9092, default_host=None)
    for url in ("k://", "k://u:hunter2@:9092", "k://a,,b"):
        with pytest.raises(ConfigurationError, match="a host is required") as caught:
            parse(url, required)
        assert "hunter2" not in str(caught.value)


def test_option_prefix_keeps_the_owners_parameters() -> None:
    spec = UrlSpec(
        "web URL",
        ("http",),
        path="optional",
        options=(Option("x_n", "int", 1), Option("x_secret", secret=True)),
        option_prefix="x_",
    )
    url = parse("http://h/p?a=1&X_N=3&b=%20&c", spec)
    assert url.options["x_n"] == 3
    assert url.kept_query == "a=1&b=%20&c"
    assert "a=1" not in repr(url)
    with pytest.raises(ConfigurationError, match="unknown option 'x_m'; known options: x_n"):
        parse("http://h/?x_m=1", spec)


def test_safe_url_masks_the_password() -> None:
    assert safe_url("kafka", "k1:9092", username="alice", password="s3cr3t") == (
        "kafka://alice:***@k1:9092"
    )
    assert safe_url("redis", "h:6379/0", username=None, password="x") == "redis://:***@h:6379/0"
    assert safe_url("kafka", "k1:9092", username="alice", password=None) == "kafka://alice@k1:9092"
    assert safe_url("kafka", "k1:9092", username=None, password=None) == "kafka://k1:9092"
