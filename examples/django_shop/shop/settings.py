"""Settings of the example shop: as small as a Django project gets, plus outboxer.

The databases come from URLs in the environment (SQLite in this folder by default):

- ``SHOP_DATABASE``: ``postgresql://user:password@host:port/name``, ``mysql://...`` or
  ``sqlite:///path``; the orders and the outbox live there;
- ``SHOP_OTHER_DATABASE`` (optional): a second database, the alias ``other``, to show
  ``enqueue(..., using="other")``;
- ``SHOP_EMAIL_DIR`` (optional): e-mails are written there as files instead of printed.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

BASE_DIR = Path(__file__).resolve().parent.parent

SECRET_KEY = os.environ.get("SHOP_SECRET_KEY", "only-for-the-example")
DEBUG = os.environ.get("SHOP_DEBUG", "1") == "1"
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "testserver"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "outboxer.integrations.django",  # the outbox tables, manage.py outboxer, the admin's DLQ
    "orders",
]

MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "shop.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"


def database(url: str) -> dict[str, Any]:
    """A ``DATABASES`` entry from a URL (what dj-database-url does, for three backends)."""
    parts = urlsplit(url)
    if parts.scheme == "sqlite":
        path = parts.path.removeprefix("/")
        # the test database of a file database is a file too, so that a relay can open it
        return {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": path,
            "TEST": {"NAME": f"{path}.test"},
        }
    engine = {"postgresql": "postgresql", "mysql": "mysql", "mariadb": "mysql"}[parts.scheme]
    return {
        "ENGINE": f"django.db.backends.{engine}",
        "NAME": parts.path.removeprefix("/"),
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": parts.hostname or "",
        "PORT": str(parts.port or ""),
    }


DATABASES = {
    "default": database(os.environ.get("SHOP_DATABASE", f"sqlite:///{BASE_DIR / 'shop.sqlite3'}"))
}
if os.environ.get("SHOP_OTHER_DATABASE"):
    DATABASES["other"] = database(os.environ["SHOP_OTHER_DATABASE"])

OUTBOXER = {
    "DATABASE": "default",
    # The relay runs the handlers of shop/handlers.py itself (a broker URL in production:
    # kafka://..., amqp://..., with `manage.py outboxer consume` on the other side).
    "BROKER": "inprocess://shop.handlers:registry",
    "POLL_INTERVAL": 0.5,
}

if os.environ.get("SHOP_EMAIL_DIR"):
    EMAIL_BACKEND = "django.core.mail.backends.filebased.EmailBackend"
    EMAIL_FILE_PATH = os.environ["SHOP_EMAIL_DIR"]
else:
    EMAIL_BACKEND = "django.core.mail.backends.console.EmailBackend"
DEFAULT_FROM_EMAIL = "shop@example.com"
