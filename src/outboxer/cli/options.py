"""Command-line options generated from the settings dataclasses, and the few shared by hand.

A settings field is declared once, in its frozen dataclass (``outboxer.config.setting``): default,
help, range, option name. :func:`settings_options` turns a class's fields into click options
(nested settings such as a :class:`~outboxer.config.Backoff` become flat ``--retry-base``,
``--retry-factor``, ``--retry-cap``), each also read from its ``OUTBOXER_*`` variable;
:func:`build_settings` turns the parsed values back into the object. An option checks its value
with the field's own :meth:`~outboxer.config.Setting.problem`, and the object's ``__post_init__``
checks it again: the dataclass stays the one authority on what is valid.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import typing
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import click

from outboxer.config import SETTING, Setting
from outboxer.errors import ConfigurationError

F = TypeVar("F", bound=Callable[..., Any])
S = TypeVar("S")

#: Where servers listen unless told otherwise (``serve`` and the relay's ``/metrics``): only
#: this machine, so nothing is exposed by default.
DEFAULT_HOST = "127.0.0.1"


def env_option(*declarations: str, **attributes: Any) -> Callable[[F], F]:
    """``click.option`` that also reads ``OUTBOXER_<NAME>`` and shows it in ``--help``."""
    name = declarations[0].lstrip("-").replace("-", "_").upper()
    attributes.setdefault("envvar", f"OUTBOXER_{name}")
    attributes.setdefault("show_envvar", True)
    decorator: Callable[[F], F] = click.option(*declarations, **attributes)
    return decorator


def stack(*options: Callable[[F], F]) -> Callable[[F], F]:
    """Several option decorators as one, listed in ``--help`` in the order given."""

    def apply(function: F) -> F:
        for option in reversed(options):
            function = option(function)
        return function

    return apply


def host_option(option: str, meaning: str) -> Callable[[F], F]:
    """The interface a server of the command listens on (``serve``, the relay's ``/metrics``):
    this machine only unless told otherwise."""
    return env_option(
        option,
        default=DEFAULT_HOST,
        show_default=True,
        callback=_host,
        help=f"{meaning} (0.0.0.0 for every interface).",
    )


def _host(ctx: click.Context, param: click.Parameter, value: str) -> str:
    if not value.strip() or not value.isprintable():
        raise click.BadParameter("give an interface: 127.0.0.1, 0.0.0.0, ::1 or a host name")
    return value


def port_option(option: str, default: int, meaning: str) -> Callable[[F], F]:
    """The port a server of the command listens on."""
    return env_option(
        option, default=default, show_default=True, type=click.IntRange(0, 65535), help=meaning
    )


def _first_on_import_path(ctx: click.Context, param: click.Parameter, value: str) -> str:
    sys.path.insert(0, os.path.abspath(value))
    return value


#: Where handler modules are looked up first, as ``python -m`` looks in the current directory:
#: ``outboxer consume --handlers`` and ``outboxer relay --broker inprocess://``.
app_dir_option = env_option(
    "--app-dir",
    default=".",
    show_default=True,
    type=click.Path(file_okay=False),
    expose_value=False,
    callback=_first_on_import_path,
    help="Directory put first on the import path before handler modules are imported.",
)


def stored_text(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """Check that text the stores are sent (ids, topics, keys, types, database URLs) is valid
    Unicode.

    Bytes of an argument that are not UTF-8 (a pasted id in another encoding) reach Python as
    lone surrogates, which no store can send: PostgreSQL's driver refused them with its own
    message and SQLite's with an unexpected ``UnicodeEncodeError``, while MySQL found nothing.
    Refused here, they are one usage error (exit 2) naming the option, on every database. A
    click callback (of an option or of an argument, ``nargs=-1`` too).
    """
    for text in value if isinstance(value, tuple) else (value,):
        if text == "" and isinstance(param, click.Argument):
            # An id is never empty: `dlq replay ""` said "replayed 0" before its error.
            raise click.BadParameter("an id cannot be empty", ctx, param)
        if isinstance(text, str):
            try:
                text.encode()
            except UnicodeEncodeError as exc:
                raise click.BadParameter(
                    f"not valid UTF-8 (a byte it cannot decode at character {exc.start + 1})",
                    ctx,
                    param,
                ) from None
    return value


#: ``--schema``/``--table``: which outbox (:class:`~outboxer.config.TableNames`).
names_options = stack(
    env_option(
        "--schema",
        default=None,
        help="Schema of the outbox tables (PostgreSQL; the database on MySQL). "
        "Default: the connection's.",
    ),
    env_option(
        "--table",
        default="outbox",
        show_default=True,
        help="Outbox table name; the other tables are named after it.",
    ),
)
database_url_help = "postgresql://user@host/db, mysql://user@host/db or sqlite:///path.db"
database_options = stack(
    env_option("--database-url", required=True, callback=stored_text, help=database_url_help),
    names_options,
)
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON.")


def filter_text(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """A filter's text: :func:`stored_text`, and never empty (as the API's 422): ``--key ''``
    (an unset variable in a script) matched nothing and ``dlq purge`` said "purged 0"."""
    if value == "":
        raise click.BadParameter("cannot be empty", ctx, param)
    return stored_text(ctx, param, value)


#: ``--topic``/``--type``/``--key``, the filters dead letters and messages share.
filter_options = stack(
    click.option("--topic", default=None, callback=filter_text, help="Only this topic."),
    click.option(
        "--type", "type_", default=None, callback=filter_text, help="Only this message type."
    ),
    click.option("--key", default=None, callback=filter_text, help="Only this key."),
)
#: ``--limit``/``--cursor`` of a list command (pages of the same size as the admin API's).
page_options = stack(
    click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 1000)),
    click.option("--cursor", default=None, help="next_cursor of the previous page."),
)


@dataclasses.dataclass(frozen=True, slots=True)
class OptionSpec:
    """One command-line option of a settings field (or of a field of a nested setting).

    Attributes:
        path: Field names from the settings class down, e.g. ``("retry", "base")``.
        option: ``--retry-base``.
        env: ``OUTBOXER_RETRY_BASE``.
        kind: ``int``, ``float``, ``bool``, ``str`` or ``frozenset`` (of ``str``).
        default: The dataclass's default (``None``: none, or required).
        declared: The field's declaration, whose :meth:`~Setting.problem` checks the value.
        help: The help line (a nested field's help follows its parent's).
    """

    path: tuple[str, ...]
    option: str
    env: str
    kind: type
    default: Any
    declared: Setting
    help: str

    @property
    def param(self) -> str:
        """The click parameter name (an identifier unique within the class); a negated
        setting's is its flag's (``unordered``), which is what the parsed value means."""
        if self.declared.negate:
            return self.option[2:].replace("-", "_")
        return "__".join(self.path)


def option_specs(cls: type) -> Iterator[OptionSpec]:
    """The options of every declared field of the dataclass ``cls``, in field order."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        declared = f.metadata.get(SETTING)
        if declared is None:
            continue
        option = declared.option or "--" + f.name.replace("_", "-")
        env = declared.env or "OUTBOXER_" + option[2:].replace("-", "_").upper()
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = None
        hint = hints[f.name]
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):
            for inner in option_specs(hint):
                yield dataclasses.replace(
                    inner,
                    path=(f.name, *inner.path),
                    option=f"{option}-{inner.option[2:]}",
                    env=f"{env}_{inner.env.removeprefix('OUTBOXER_')}",
                    default=getattr(default, inner.path[-1]),
                    help=f"{declared.help}: {inner.help}",
                )
            continue
        # frozenset[str]: a repeatable option (its variable holds a space-separated list).
        kind = frozenset if typing.get_origin(hint) is frozenset else hint
        kind = kind if kind in (int, float, bool, frozenset) else str
        help_ = declared.help + (f" ({declared.range()})" if declared.range() else "")
        yield OptionSpec((f.name,), option, env, kind, default, declared, help_)


def checked(declared: Setting) -> Callable[[click.Context, click.Parameter, Any], Any]:
    """An option callback refusing what the field's own declaration refuses (non-finite or
    out-of-range numbers), as a usage error naming the option."""

    def check(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        problem = declared.problem(value)
        if problem is not None:
            raise click.BadParameter(problem, ctx, param)
        return value

    return check


def _click_option(spec: OptionSpec) -> Callable[[F], F]:
    attributes: dict[str, Any] = {"envvar": spec.env, "show_envvar": True, "help": spec.help}
    if spec.kind is bool:
        # A negated setting is offered as the flag that turns it off (--unordered).
        attributes.update(is_flag=True, default=False if spec.declared.negate else spec.default)
    elif spec.kind is frozenset:
        attributes.update(multiple=True, default=tuple(spec.default))
    else:
        attributes.update(
            type={int: click.INT, float: click.FLOAT}.get(spec.kind, click.STRING),
            callback=checked(spec.declared),
            default=spec.default,
            show_default=spec.default is not None and not spec.declared.secret,
        )
    decorator: Callable[[F], F] = click.option(spec.option, spec.param, **attributes)
    return decorator


def settings_options(cls: type) -> Callable[[F], F]:
    """The click options of every declared field of the settings class ``cls``."""
    return stack(*(_click_option(spec) for spec in option_specs(cls)))


def build_settings(cls: type[S], values: dict[str, Any], **given: Any) -> S:
    """Take ``cls``'s options out of ``values`` (a command's ``**values``) and build ``cls``.

    Args:
        cls: The settings class whose options were added by :func:`settings_options`.
        values: The command's parsed options; ``cls``'s are removed, the rest stay.
        given: Fields the command decides itself (e.g. a default derived from another option).

    Raises:
        ConfigurationError: a refused value (the command ends with one line, exit code 2).
    """
    fields: dict[str, Any] = {}
    nested: dict[str, dict[str, Any]] = {}
    options: dict[str, list[str]] = {}
    for spec in option_specs(cls):
        value: Any = values.pop(spec.param)
        if spec.declared.negate:
            value = not value
        elif spec.kind is frozenset:
            value = frozenset(value)
        if len(spec.path) == 1:
            fields[spec.path[0]] = value
        else:
            nested.setdefault(spec.path[0], {})[spec.path[1]] = value
            options.setdefault(spec.path[0], []).append(spec.option)
    hints = typing.get_type_hints(cls)
    for name, inner in nested.items():
        try:
            fields[name] = hints[name](**inner)
        except ConfigurationError as exc:
            raise ConfigurationError(f"{'/'.join(options[name])}: {exc}") from exc
    return cls(**{**fields, **given})
