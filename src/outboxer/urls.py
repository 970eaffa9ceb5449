"""One URL grammar for databases and brokers, and one scheme registry.

Every URL outboxer accepts (``postgresql://``, ``sqlite:///``, ``mysql://``, ``kafka://``,
``amqp://``, ``nats://``, ``redis://``, ``http(s)://``, ``inprocess://``) is read here, against a
:class:`UrlSpec` its adapter declares: which schemes, whether it names hosts, whether it takes a
path, and its typed ``?name=value`` options. This module imports no driver, so the CLI and the
core can read and check a URL before any adapter is loaded.

Rules shared by every URL:

- unknown or repeated options are refused in one line that lists the known ones;
- numbers are finite and within the declared range; booleans are ``true/false`` (also
  ``1/0``, ``yes/no``, ``on/off``);
- ports are integers 1-65535; IPv6 hosts are written in brackets (``[::1]:5432``);
- the password is kept in :attr:`ParsedUrl.password` (hidden from ``repr``) and never appears in
  an error message or a log line: :func:`redact` is the one routine that masks it, for any text.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import parse_qsl, unquote

from outboxer.errors import ConfigurationError

__all__ = [
    "SCHEMES",
    "Option",
    "ParsedUrl",
    "Scheme",
    "UrlSpec",
    "lookup",
    "parse",
    "redact",
    "safe_url",
    "scheme_of",
]

MASK = "***"

OptionKind = Literal["str", "int", "float", "bool"]


@dataclass(frozen=True, slots=True)
class Option:
    """One declared ``?name=value`` option of a URL.

    Attributes:
        name: The option's name in the query string.
        kind: ``str``, ``int``, ``float`` (finite) or ``bool``.
        default: The value when the option is absent (``None``: absent stays ``None``).
        minimum: Smallest accepted number (inclusive), for ``int``/``float``.
        maximum: Largest accepted number (inclusive), for ``int``/``float``.
        choices: Accepted values of a ``str`` option (compared case-insensitively; the value is
            returned as listed here).
        secret: The value is a credential: never shown by :func:`redact`'s output.
        help: One line for documentation.
    """

    name: str
    kind: OptionKind = "str"
    default: Any = None
    minimum: float | None = None
    maximum: float | None = None
    choices: Sequence[str] | None = None
    secret: bool = False
    help: str = ""

    def convert(self, raw: str, what: str) -> Any:
        """The typed value of ``raw``; raises one readable ``ConfigurationError``."""
        problem = f"{what}: {self.name}={MASK if self.secret else repr(raw)}"
        if self.kind == "str":
            return self._text(raw, problem)
        if self.kind == "bool":
            return self._bool(raw, problem)
        return self._number(raw, problem)

    def _text(self, raw: str, problem: str) -> str:
        if self.choices is None:
            return raw
        for choice in self.choices:
            if choice.lower() == raw.strip().lower():
                return choice
        raise ConfigurationError(f"{problem} is not one of " + ", ".join(self.choices))

    @staticmethod
    def _bool(raw: str, problem: str) -> bool:
        value = raw.strip().lower()
        if value in _TRUE or value in _FALSE:
            return value in _TRUE
        raise ConfigurationError(f"{problem}: use true or false")

    def _number(self, raw: str, problem: str) -> float:
        number: float
        try:
            number = int(raw) if self.kind == "int" else float(raw)
        except ValueError:
            kind = "an integer" if self.kind == "int" else "a number"
            raise ConfigurationError(f"{problem} is not {kind}") from None
        if not math.isfinite(number):
            raise ConfigurationError(f"{problem} must be a finite number")
        low = -math.inf if self.minimum is None else self.minimum
        high = math.inf if self.maximum is None else self.maximum
        if not low <= number <= high:
            raise ConfigurationError(
                f"{problem} is out of range ({_bound(self.minimum)} to {_bound(self.maximum)})"
            )
        return number


#: The timeouts every database URL of a pooled store takes (PostgreSQL, MySQL/MariaDB).
CONNECT_TIMEOUT = Option(
    "connect_timeout",
    kind="float",
    default=10.0,
    minimum=0.1,
    maximum=3600,
    help="Seconds to wait for a connection.",
)
COMMAND_TIMEOUT = Option(
    "command_timeout",
    kind="float",
    default=60.0,
    minimum=0,
    maximum=86400,
    help="Seconds any one statement may wait for the server's answer before the database "
    "counts as unavailable (0: no limit; schema migrations have none).",
)

_TRUE = frozenset({"true", "1", "yes", "on"})
_FALSE = frozenset({"false", "0", "no", "off"})


def _bound(value: float | None) -> str:
    if value is None:
        return "any"
    return str(int(value)) if float(value).is_integer() else str(value)


HostRule = Literal["none", "one", "many", "opaque"]
PathRule = Literal["none", "optional", "required"]


@dataclass(frozen=True, slots=True)
class UrlSpec:
    """What a URL of one adapter may contain.

    Attributes:
        what: How errors name the URL, e.g. ``"kafka URL"``.
        schemes: Accepted schemes, lower case.
        hosts: ``none`` (``sqlite:///path``), ``one`` host, ``many`` comma-separated hosts, or
            ``opaque`` (the authority is not a host, e.g. ``inprocess://pkg.module:registry``).
        default_port: Port of a host given without one; a mapping gives one per scheme
            (``{"amqp": 5672, "amqps": 5671}``).
        default_host: The host of a URL that names none (``amqp://`` means localhost); ``None``:
            a host is required. Used only when the scheme has a default port.
        path: Whether a ``/path`` is refused, optional or required.
        options: The declared query options.
        credentials: Whether ``user:password@`` is accepted.
        example: A well-formed URL, shown in errors.
        option_prefix: When set, only query parameters whose name starts with it are options
            (declared with the prefix); the others belong to the URL's owner (a webhook
            receiver's own parameters) and are kept verbatim in :attr:`ParsedUrl.kept_query`.
    """

    what: str
    schemes: Sequence[str]
    hosts: HostRule = "one"
    default_port: int | Mapping[str, int] | None = None
    default_host: str | None = "127.0.0.1"
    path: PathRule = "none"
    options: Sequence[Option] = ()
    credentials: bool = True
    example: str = ""
    option_prefix: str | None = None

    def port_for(self, scheme: str) -> int | None:
        """The default port of ``scheme``'s URLs."""
        if isinstance(self.default_port, Mapping):
            return self.default_port.get(scheme)
        return self.default_port

    def option(self, name: str) -> Option:
        for option in self.options:
            if option.name == name:
                return option
        raise KeyError(name)


@dataclass(frozen=True, slots=True)
class ParsedUrl:
    """A URL checked against its :class:`UrlSpec`.

    Attributes:
        scheme: Lower-case scheme as written (``postgresql``, ``rediss``, ...).
        username: Percent-decoded user, or ``None``.
        password: Percent-decoded password, or ``None``; hidden from ``repr``.
        hosts: ``(host, port)`` pairs; IPv6 hosts without brackets.
        authority: The raw text between ``//`` and the path (for ``opaque`` URLs).
        path: Percent-decoded path without its leading ``/`` (``""`` when absent).
        options: Every declared option's typed value (defaults filled in).
        given: The names of the options the URL actually set.
        url: The URL as given; hidden from ``repr`` (use :meth:`redacted`).
        kept_query: The query parameters that are not options (only with
            :attr:`UrlSpec.option_prefix`), as written, joined by ``&``; hidden from ``repr``
            (a receiver's parameters may be tokens).
    """

    scheme: str
    username: str | None
    password: str | None = field(repr=False)
    hosts: tuple[tuple[str, int | None], ...]
    authority: str = field(repr=False)
    path: str
    options: Mapping[str, Any]
    given: frozenset[str]
    url: str = field(repr=False)
    kept_query: str = field(default="", repr=False)

    @property
    def host(self) -> str:
        """The first host (``""`` when the URL names none)."""
        return self.hosts[0][0] if self.hosts else ""

    @property
    def port(self) -> int | None:
        """The first host's port."""
        return self.hosts[0][1] if self.hosts else None

    def netloc(self) -> str:
        """``host:port[,host:port]`` with IPv6 hosts in brackets (no credentials)."""
        return ",".join(
            (f"[{h}]" if ":" in h else h) + (f":{p}" if p is not None else "")
            for h, p in self.hosts
        )

    def redacted(self) -> str:
        """The URL with its password masked, for logs and errors."""
        return redact(self.url)

    def values(self, options: Sequence[Option]) -> dict[str, Any]:
        """The typed values of ``options`` by name, e.g. to build a settings dataclass whose
        fields are named like its URL options."""
        return {option.name: self.options[option.name] for option in options}


def parse(url: str, spec: UrlSpec) -> ParsedUrl:
    """Read ``url`` according to ``spec``.

    Raises:
        ConfigurationError: one line naming the problem; the password never appears in it.
    """
    scheme, rest = _scheme_and_rest(url, spec)
    rest, _, query = rest.partition("?")
    # Credentials end at the last "@": a password may hold "/" or ":" (an "@" inside it must be
    # percent-encoded, as everywhere else), so the authority cannot be cut at the first "/".
    at = rest.rfind("@") if spec.credentials else -1
    userinfo, hostpart = (rest[:at], rest[at + 1 :]) if at >= 0 else (None, rest)
    authority, _, path = hostpart.partition("/")
    username, password = _credentials(userinfo)
    hosts = _hosts(authority, spec, spec.port_for(scheme))
    path = _path(unquote(path), spec)
    query, kept_query = _split_query(query, spec.option_prefix)
    options, given = _options(query, spec)
    return ParsedUrl(
        scheme=scheme,
        username=username,
        password=password,
        hosts=hosts,
        authority=authority,
        path=path,
        options=options,
        given=given,
        url=url,
        kept_query=kept_query,
    )


def _scheme_and_rest(url: str, spec: UrlSpec) -> tuple[str, str]:
    """The scheme and what follows ``scheme://`` (without a fragment, which is refused)."""
    what = spec.what
    if not isinstance(url, str) or not url.strip():
        raise ConfigurationError(f"{what}: empty URL{_example(spec)}")
    if url != url.strip() or any(ch.isspace() or ord(ch) < 0x20 for ch in url):
        raise ConfigurationError(f"{what}: the URL contains spaces or control characters")
    scheme = scheme_of(url)
    if scheme not in spec.schemes:
        raise ConfigurationError(
            f"{what}: scheme {scheme + '://' if scheme else 'missing'} is not accepted; use "
            + " or ".join(f"{s}://" for s in spec.schemes)
            + _example(spec)
        )
    rest = url.split(":", 1)[1]
    if not rest.startswith("//"):
        raise ConfigurationError(f"{what}: expected {scheme}:// followed by the address")
    rest, _, fragment = rest[2:].partition("#")
    if fragment:
        raise ConfigurationError(f"{what}: a #fragment is not allowed")
    return scheme, rest


def _credentials(userinfo: str | None) -> tuple[str | None, str | None]:
    if userinfo is None:
        return None, None
    user, colon, secret = userinfo.partition(":")
    return unquote(user) or None, unquote(secret) if colon else None


def _path(path: str, spec: UrlSpec) -> str:
    if spec.path == "none" and path:
        raise ConfigurationError(f"{spec.what}: a path (/{path}) is not allowed{_example(spec)}")
    if spec.path == "required" and not path:
        raise ConfigurationError(f"{spec.what}: a path is required{_example(spec)}")
    return path


def _split_query(query: str, prefix: str | None) -> tuple[str, str]:
    """``query`` split into the options (names starting with ``prefix``, any case) and the
    rest, kept byte for byte."""
    if prefix is None or not query:
        return query, ""
    ours: list[str] = []
    kept: list[str] = []
    for item in query.split("&"):
        (ours if item.lower().startswith(prefix) else kept).append(item)
    return "&".join(ours), "&".join(kept)


def _hosts(
    authority: str, spec: UrlSpec, default_port: int | None
) -> tuple[tuple[str, int | None], ...]:
    what = spec.what
    if spec.hosts == "opaque":
        if not authority:
            raise ConfigurationError(f"{what}: nothing after ://{_example(spec)}")
        return ()
    if spec.hosts == "none":
        if authority:
            raise ConfigurationError(
                f"{what}: no host is allowed (three slashes before the path){_example(spec)}"
            )
        return ()
    if not authority:
        if default_port is None or spec.default_host is None:
            raise ConfigurationError(f"{what}: a host is required{_example(spec)}")
        return ((spec.default_host, default_port),)
    parts = authority.split(",")
    if len(parts) > 1 and spec.hosts != "many":
        raise ConfigurationError(f"{what}: only one host is allowed")
    return tuple(_host(part, spec, default_port) for part in parts)


_HOSTNAME = re.compile(r"[A-Za-z0-9_.\-%~]+")


def _host(text: str, spec: UrlSpec, default_port: int | None) -> tuple[str, int | None]:
    what = spec.what
    host, port_text = _ipv6(text, what) if text.startswith("[") else _hostname(text, spec)
    if not port_text:
        return host, default_port
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise ConfigurationError(f"{what}: port {port_text!r} must be a number from 1 to 65535")
    return host, int(port_text)


def _ipv6(text: str, what: str) -> tuple[str, str]:
    """``[address]:port`` → (address, port text)."""
    host, bracket, after = text[1:].partition("]")
    if not bracket or not host or not all(c in "0123456789abcdefABCDEF:.%" for c in host):
        raise ConfigurationError(f"{what}: malformed IPv6 address {text!r}")
    if after and not after.startswith(":"):
        raise ConfigurationError(f"{what}: malformed host {text!r}")
    return host, after[1:]


def _hostname(text: str, spec: UrlSpec) -> tuple[str, str]:
    """``name:port`` → (name, port text)."""
    host, _, port_text = text.partition(":")
    if not host:
        raise ConfigurationError(f"{spec.what}: a host is required in {text!r}{_example(spec)}")
    if not _HOSTNAME.fullmatch(host):
        raise ConfigurationError(f"{spec.what}: malformed host {text!r}{_example(spec)}")
    return host, port_text


def _options(query: str, spec: UrlSpec) -> tuple[dict[str, Any], frozenset[str]]:
    what = spec.what
    declared = {option.name: option for option in spec.options}
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError:
        raise ConfigurationError(f"{what}: malformed query string (use ?name=value&...)") from None
    values: dict[str, Any] = {name: option.default for name, option in declared.items()}
    given: set[str] = set()
    for name, raw in pairs:
        if spec.option_prefix is not None:  # prefixed names are matched in any case
            name = name.lower()
        option = declared.get(name)
        if option is None:
            known = ", ".join(declared) or "none"
            raise ConfigurationError(f"{what}: unknown option {name!r}; known options: {known}")
        if name in given:
            raise ConfigurationError(f"{what}: option {name!r} is given more than once")
        given.add(name)
        values[name] = option.convert(raw, what)
    return values, frozenset(given)


def _example(spec: UrlSpec) -> str:
    return f", e.g. {spec.example}" if spec.example else ""


# -- redaction ---------------------------------------------------------------------------------

# scheme:, any slashes (also a mistyped "postgresql:/"), then user:password@. The password runs
# to the last "@" before whitespace or a quote, so a "/" or ":" inside it is masked too.
_URL_CREDENTIALS = re.compile(
    r"(?P<prefix>\b[A-Za-z][A-Za-z0-9+.\-]*:/{0,3}[^\s:/@'\"]*):(?P<secret>[^\s'\"]*)@"
)
_SECRET_PARAM = re.compile(
    r"(?P<name>\b(?:password|passwd|pwd|secret|token|access_token|api_key|apikey)=)[^&\s\"']+",
    re.IGNORECASE,
)
_BEARER = re.compile(r"(?P<scheme>\bBearer\s+)[A-Za-z0-9\-._~+/]+=*", re.IGNORECASE)


def safe_url(scheme: str, netloc: str, *, username: str | None, password: str | None) -> str:
    """``scheme://[user[:***]@]netloc`` for logs and errors: a URL rebuilt from settings with
    its password masked (never written out, so no pattern has to find it again)."""
    if password is not None:
        credentials = f"{username or ''}:{MASK}@"
    else:
        credentials = f"{username}@" if username else ""
    return f"{scheme}://{credentials}{netloc}"


def redact(text: str) -> str:
    """``text`` with URL passwords, secret query parameters and bearer tokens masked.

    The one redaction routine: URLs in errors, log lines, ``repr`` and CLI output go through it.
    """
    if "@" in text:
        text = _URL_CREDENTIALS.sub(rf"\g<prefix>:{MASK}@", text)
    if "=" in text:
        text = _SECRET_PARAM.sub(rf"\g<name>{MASK}", text)
    if "earer" in text:
        text = _BEARER.sub(rf"\g<scheme>{MASK}", text)
    return text


# -- the scheme registry -----------------------------------------------------------------------

SchemeKind = Literal["database", "broker"]


@dataclass(frozen=True, slots=True)
class Scheme:
    """Where the adapter for a URL scheme lives (imported only when used).

    Attributes:
        name: The adapter's short name (``postgres``, ``kafka`` ...): metrics labels, span
            attributes, messages.
        kind: ``database`` or ``broker``.
        module: The adapter package, e.g. ``outboxer.stores.postgres``.
        extra: The pip extra that installs its driver (``None``: no driver needed).
    """

    name: str
    kind: SchemeKind
    module: str
    extra: str | None


SCHEMES: Mapping[str, Scheme] = {
    "postgresql": Scheme("postgres", "database", "outboxer.stores.postgres", "postgres"),
    "postgres": Scheme("postgres", "database", "outboxer.stores.postgres", "postgres"),
    "sqlite": Scheme("sqlite", "database", "outboxer.stores.sqlite", None),
    "mysql": Scheme("mysql", "database", "outboxer.stores.mysql", "mysql"),
    "mariadb": Scheme("mysql", "database", "outboxer.stores.mysql", "mysql"),
    "inprocess": Scheme("inprocess", "broker", "outboxer.brokers.inprocess", None),
    "kafka": Scheme("kafka", "broker", "outboxer.brokers.kafka", "kafka"),
    "amqp": Scheme("rabbitmq", "broker", "outboxer.brokers.rabbitmq", "rabbitmq"),
    "amqps": Scheme("rabbitmq", "broker", "outboxer.brokers.rabbitmq", "rabbitmq"),
    "nats": Scheme("nats", "broker", "outboxer.brokers.nats", "nats"),
    "redis": Scheme("redis", "broker", "outboxer.brokers.redis", "redis"),
    "rediss": Scheme("redis", "broker", "outboxer.brokers.redis", "redis"),
    "http": Scheme("http", "broker", "outboxer.brokers.http", "http"),
    "https": Scheme("http", "broker", "outboxer.brokers.http", "http"),
}

_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*):")


def scheme_of(url: str) -> str:
    """The lower-case scheme of ``url`` without a ``+driver`` suffix; ``""`` if it has none."""
    match = _SCHEME.match(url) if isinstance(url, str) else None
    return match.group(1).split("+")[0].lower() if match else ""


def lookup(url: str, kind: SchemeKind) -> Scheme:
    """The registered adapter for ``url``'s scheme.

    Raises:
        ConfigurationError: unknown scheme, or a scheme of the other kind (a broker URL given
            as the database); the message lists the accepted schemes and shows no password.
    """
    scheme = scheme_of(url)
    entry = SCHEMES.get(scheme)
    if entry is None or entry.kind != kind:
        accepted = ", ".join(f"{s}://" for s, e in SCHEMES.items() if e.kind == kind)
        shown = f"{scheme}://" if scheme else repr(redact(url))
        raise ConfigurationError(f"unsupported {kind} URL {shown}: use one of {accepted}")
    return entry


def loader(url: str, kind: SchemeKind) -> Callable[[], Any]:
    """A function importing the adapter module for ``url`` (a missing driver names its extra)."""
    entry = lookup(url, kind)

    def load() -> Any:
        import importlib

        try:
            return importlib.import_module(entry.module)
        except ImportError as exc:
            hint = f" (pip install 'outboxer[{entry.extra}]')" if entry.extra else ""
            raise ConfigurationError(
                f"the {scheme_of(url)}:// {kind} adapter is not available: {exc}{hint}"
            ) from exc

    return load
