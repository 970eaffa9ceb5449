"""Integrations with application frameworks, each importing its framework only when used.

- :mod:`outboxer.integrations.alembic`: the outbox schema inside a project's Alembic migrations;
- :mod:`outboxer.integrations.django`: a Django app (migrations, settings, management commands,
  dead letters in the admin).

The write API needs no integration: ``outboxer.enqueue`` takes a SQLAlchemy session or Django's
connection as it takes a driver's (:mod:`outboxer.writers`). Nothing in the core imports this
package (an import-linter contract in ``pyproject.toml``).
"""
