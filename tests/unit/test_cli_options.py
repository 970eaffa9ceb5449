"""The command line cannot drift from the settings dataclasses: every field has an option and an
``OUTBOXER_*`` variable, the options' defaults are the dataclass's, and docs/configuration.md
lists exactly the options the commands have (`python -m tests.unit.test_cli_options` rewrites
its tables)."""

from __future__ import annotations

import dataclasses
import math
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import click
import pytest

from outboxer.cli import main
from outboxer.cli.options import DEFAULT_HOST, build_settings
from outboxer.config import AdminSettings, Backoff, RelaySettings
from outboxer.errors import ConfigurationError
from outboxer.inbox import InboxSettings

ROOT = Path(__file__).resolve().parents[2]
REQUIRED = {
    "relay": ["--database-url", "sqlite:///x.db", "--broker", "inprocess://m:r"],
    "consume": ["--database-url", "sqlite:///x.db", "--broker", "redis://h", "--handlers", "m:r"],
    "serve": ["--database-url", "sqlite:///x.db"],
}
SETTINGS: dict[str, tuple[type, dict[str, Any]]] = {
    "relay": (RelaySettings, {}),
    "consume": (InboxSettings, {"consumer": "c"}),
    "serve": (AdminSettings, {}),
}


def command(name: str) -> click.Command:
    found = main.commands[name]
    assert isinstance(found, click.Command)
    return found


@pytest.fixture(autouse=True)
def no_outboxer_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in [v for v in os.environ if v.startswith("OUTBOXER_")]:
        monkeypatch.delenv(variable)


def parse(name: str) -> Any:
    """The settings object ``outboxer NAME`` builds from its required options and the
    environment."""
    cls, given = SETTINGS[name]
    values = dict(command(name).make_context(name, list(REQUIRED[name])).params)
    if values.get("consumer") is not None:
        given = {}  # --consumer-name given: the command's own default is not needed
    return build_settings(cls, values, **given)


def leaves(obj: Any, prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], Any]:
    """Every leaf field of a settings object by path (``("retry", "base")``)."""
    out: dict[tuple[str, ...], Any] = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            out.update(leaves(value, (*prefix, f.name)))
        else:
            out[(*prefix, f.name)] = value
    return out


def changed_value(option: click.Option, default: Any) -> str:
    """A valid value for ``option`` different from its default, as an environment variable."""
    if option.is_flag:
        return "1"
    if isinstance(option.type, click.types.IntParamType):
        return str(default + 1)
    if isinstance(option.type, click.types.FloatParamType):
        # Half: one more second would be over the heartbeat's 5 s, its default and its most.
        return repr(default / 2)
    return "changed-name"


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_option_defaults_are_the_dataclass_defaults(name: str) -> None:
    cls, given = SETTINGS[name]
    assert parse(name) == cls(**given)


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_every_settings_field_has_one_option_and_environment_variable(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    cls, given = SETTINGS[name]
    default = leaves(cls(**given))
    covered: dict[tuple[str, ...], str] = {}
    for option in command(name).params:
        if not isinstance(option, click.Option) or option.name in (None, "help"):
            continue
        assert isinstance(option.envvar, str) and option.envvar.startswith("OUTBOXER_")
        assert option.show_envvar, option.opts
        with monkeypatch.context() as env:
            env.setenv(option.envvar, changed_value(option, option.default))
            built = leaves(parse(name))
        moved = [path for path, value in built.items() if value != default[path]]
        if not moved:
            continue  # not a settings option (it changed nothing in the settings)
        assert len(moved) == 1, (option.opts, moved)
        assert moved[0] not in covered, (option.opts, covered[moved[0]])
        covered[moved[0]] = option.opts[0]
    assert set(covered) == set(default), set(default) - set(covered)


def test_nested_backoff_fields_are_flat_options_with_the_documented_names() -> None:
    names = {o for p in command("relay").params for o in getattr(p, "opts", [])}
    for prefix in ("--retry", "--outage"):
        assert {f"{prefix}-base", f"{prefix}-factor", f"{prefix}-cap"} <= names
    consume = {
        p.opts[0]: p.envvar for p in command("consume").params if isinstance(p, click.Option)
    }
    assert consume["--retry-base"] == "OUTBOXER_CONSUME_RETRY_BASE"
    assert consume["--retry-interval"] == "OUTBOXER_CONSUME_RETRY_INTERVAL"
    assert consume["--max-attempts"] == "OUTBOXER_CONSUME_MAX_ATTEMPTS"


@pytest.mark.parametrize(
    ("cls", "changes"),
    [
        (Backoff, {"cap": math.nan}),
        (Backoff, {"base": math.inf}),
        (Backoff, {"factor": math.nan}),
        (RelaySettings, {"dead_letter_retention": 1e300}),
        (RelaySettings, {"dead_letter_retention": math.inf}),
        (RelaySettings, {"lease_seconds": math.nan}),
        (RelaySettings, {"lease_seconds": 0.003}),  # expires while its own relay publishes
        (RelaySettings, {"batch_size": 0}),
        # Written in the registry row and every lease: a store must be able to keep it.
        (RelaySettings, {"relay_id": "r" * 256}),
        (RelaySettings, {"relay_id": "relay\x00one"}),
        (RelaySettings, {"relay_id": "relay\ud800"}),
        (InboxSettings, {"consumer": "c", "retention": math.nan}),
        (InboxSettings, {"consumer": "c", "dead_letter_retention": -1.0}),
        (AdminSettings, {"ready_max_age": math.nan}),
        (AdminSettings, {"ready_min_relays": -1}),
    ],
)
def test_settings_refuse_non_finite_and_out_of_range_numbers(
    cls: type, changes: dict[str, Any]
) -> None:
    with pytest.raises(ConfigurationError, match="must be"):
        cls(**changes)


@pytest.mark.parametrize("name", ["", " ", "a b", "x/y", "user@host", "évil.example"])
def test_an_allowed_host_that_no_host_header_can_carry_is_refused(name: str) -> None:
    """``--allowed-host ''`` was accepted and ignored: an operator who meant a name (an unset
    variable in a script) got a server refusing every request by that name (a probe)."""
    with pytest.raises(ConfigurationError, match="is not a host name"):
        AdminSettings(allowed_hosts=frozenset({name}))
    for good in ("*", ".example.com", "admin.example.com", "localhost", "::", "0.0.0.0"):
        AdminSettings(allowed_hosts=frozenset({good}))


def test_derived_settings_follow_the_values_they_depend_on() -> None:
    settings = RelaySettings(lease_seconds=3, poll_interval=0.001)
    assert settings.heartbeat_interval == 1.0  # a third of the lease
    assert settings.min_poll_interval == 0.001  # never above poll_interval


def test_relay_metrics_and_serve_listen_on_the_same_default_host() -> None:
    def default(name: str, option: str) -> Any:
        [found] = [p for p in command(name).params if option in getattr(p, "opts", [])]
        return found.default

    assert default("relay", "--metrics-host") == default("serve", "--host") == DEFAULT_HOST
    assert DEFAULT_HOST == "127.0.0.1"


def options_table(name: str) -> str:
    """The markdown table of ``outboxer NAME``'s options as docs/configuration.md shows it."""
    rows = ["| option | env | default | meaning |", "|---|---|---|---|"]
    for p in command(name).params:
        if not isinstance(p, click.Option) or p.name == "help":
            continue
        if p.required:
            default = "required"
        elif p.is_flag:
            default = "off"
        elif p.default is None or p.multiple:
            default = "—"
        else:
            default = f"`{p.default}`"
        meaning = re.sub(r"\s+", " ", (p.help or "").replace("|", "\\|")).strip()
        rows.append(f"| `{p.opts[0]}` | `{p.envvar}` | {default} | {meaning} |")
    return "\n".join(rows)


@pytest.mark.parametrize("name", ["relay", "consume", "serve"])
def test_docs_list_every_option_of_the_command(name: str) -> None:
    docs = (ROOT / "docs" / "configuration.md").read_text()
    match = re.search(rf"<!-- options: {name} -->\n(.*?)\n<!-- end -->", docs, re.DOTALL)
    assert match, f"docs/configuration.md has no '<!-- options: {name} -->' section"
    assert match.group(1) == options_table(name), (
        f"docs/configuration.md is out of date; the table for {name} is:\n{options_table(name)}"
    )


if __name__ == "__main__":  # python -m tests.unit.test_cli_options: rewrite the docs' tables
    path = ROOT / "docs" / "configuration.md"
    text = path.read_text()
    for name in ("relay", "consume", "serve"):
        text = re.sub(
            rf"(<!-- options: {name} -->\n).*?(\n<!-- end -->)",
            lambda m, name=name: m.group(1) + options_table(name) + m.group(2),
            text,
            flags=re.DOTALL,
        )
    path.write_text(text)


def test_python_m_outboxer_is_the_command(tmp_path: Path) -> None:
    """``python -m outboxer`` runs the CLI, its failures one line and the documented exit code."""
    ok = subprocess.run(
        [sys.executable, "-m", "outboxer", "--version"], capture_output=True, text=True, timeout=60
    )
    assert (ok.returncode, ok.stdout.split()[0]) == (0, "outboxer,"), ok.stderr
    url = f"sqlite:///{tmp_path}/missing/x.db"
    bad = subprocess.run(
        [sys.executable, "-m", "outboxer", "stats", "--database-url", url],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2
    assert bad.stderr.count("\n") == 1 and bad.stderr.startswith("outboxer: error:"), bad.stderr
