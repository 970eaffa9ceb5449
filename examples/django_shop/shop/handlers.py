"""What happens after a commit: the e-mails, run by ``manage.py outboxer relay``.

The relay of this example publishes to the in-process broker: it calls these handlers itself
(``OUTBOXER["BROKER"] = "inprocess://shop.handlers:registry"``). A handler that raises is
retried with backoff, then dead-lettered (see the admin's dead letters).
"""

from __future__ import annotations

from django.core.mail import EmailMessage
from orders.events import CustomerRegistered, OrderPlaced

from outboxer.inbox import HandlerContext, HandlerRegistry

registry = HandlerRegistry()


def _mail(to: str, subject: str, body: str, ctx: HandlerContext) -> None:
    # The message id as the mail's Message-ID: a mail sent twice (a relay that crashed between
    # the send and its acknowledgement) has the same one, which mail systems drop.
    EmailMessage(
        subject, body, to=[to], headers={"Message-ID": f"<{ctx.message.id}@shop.example>"}
    ).send()


@registry.handler()
def send_welcome_email(event: CustomerRegistered, ctx: HandlerContext) -> None:
    _mail(event.email, "Welcome to the shop", f"Hello {event.name}, welcome!", ctx)


@registry.handler()
def confirm_order(event: OrderPlaced, ctx: HandlerContext) -> None:
    _mail(
        event.email,
        f"Order {event.order_id} confirmed",
        f"{event.quantity} × {event.item}, {event.total_cents / 100:.2f} EUR.",
        ctx,
    )
