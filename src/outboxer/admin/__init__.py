"""Admin HTTP API, Prometheus metrics and dashboard (``pip install 'outboxer[admin]'``).

An adapter like the stores: it sees only the :class:`~outboxer.ports.AdminStore` Protocol
(stats and dead letters).
``outboxer serve`` runs it; to mount it in your own ASGI service::

    from outboxer.admin import create_app

    admin = create_app(store, token=os.environ.get("OUTBOXER_ADMIN_TOKEN"))
    app.mount("/outboxer", admin)      # the caller owns the store's lifecycle

or let the app own the store: ``create_app_from_url("postgresql://…", token=...)``.
"""

from outboxer.admin.app import AdminSettings, create_app, create_app_from_url

__all__ = ["AdminSettings", "create_app", "create_app_from_url"]
