"""Run the real ``outboxer`` console script as a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OUTBOXER = str(Path(sys.executable).parent / "outboxer")
#: The subprocess imports this checkout's ``outboxer`` (src/) first, whichever copy is installed.
PYTHONPATH = os.pathsep.join([str(ROOT / "src"), str(ROOT)])


class Cli:
    def __init__(self, env: dict[str, str]) -> None:
        self.env = env

    def __call__(
        self, *args: str, timeout: float = 60, input: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [OUTBOXER, *args],
            capture_output=True,
            text=True,
            env=self.env,
            timeout=timeout,
            input=input,
            cwd=ROOT,
        )

    def start(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [OUTBOXER, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=self.env,
            cwd=ROOT,
        )


@pytest.fixture
def sink(tmp_path: Path) -> Path:
    path = tmp_path / "delivered.txt"
    path.touch()
    return path


@pytest.fixture
def cli(sink: Path) -> Cli:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOXER_")}
    env["PYTHONPATH"] = PYTHONPATH
    env["OUTBOXER_TEST_SINK"] = str(sink)
    return Cli(env)


def assert_one_line_error(result: subprocess.CompletedProcess[str], code: int, *words: str) -> None:
    """A failure is one readable line on stderr and a non-zero exit, never a traceback."""
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for word in words:
        assert word in lines[0], lines[0]


def lines(path: Path) -> Sequence[str]:
    return path.read_text().split()
