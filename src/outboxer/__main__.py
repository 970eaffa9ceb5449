"""``python -m outboxer``: the ``outboxer`` command (for an environment whose scripts are not on
``PATH``)."""

import sys

from outboxer.cli import invoke

if __name__ == "__main__":
    sys.exit(invoke(prog_name="outboxer"))
