"""The receiving side: ``SendWelcomeEmail`` e-mails each registered user, once.

Run by ``outboxer consume --handlers examples.user_registration.handlers:registry ...``. The
consumer's inbox makes the handler's database writes happen once per message; the e-mail itself
leaves the database, so here is how its at-least-once window is kept small:

1. the mail is sent first, then ``welcomed_at`` is written through ``ctx.connection``, and the
   inbox row commits with it right after the handler returns: a crash can only repeat the mail
   if it lands between the SMTP server's "250 accepted" and that commit (milliseconds);
2. a user already marked ``welcomed_at`` (a replay, a second consumer name) is not mailed again;
3. every mail carries ``Message-ID: <outbox message id@outboxer>``, the same on every attempt,
   so a mail system or client that drops repeated Message-IDs drops a repeat.

``SMTP_HOST``/``SMTP_PORT`` (default ``127.0.0.1:8025``) and ``EXAMPLE_SCHEMA`` are read when a
mail is sent.
"""

from __future__ import annotations

import asyncio
import os
import smtplib
from email.message import EmailMessage

from examples.user_registration.events import UserRegistered

from outboxer.inbox import HandlerContext, HandlerRegistry

registry = HandlerRegistry()

SENDER = "welcome@example.com"


@registry.handler()  # handles "UserRegistered": the type of its first parameter
class SendWelcomeEmail:
    """Sends the welcome e-mail over SMTP and records it on the user's row."""

    async def __call__(self, event: UserRegistered, ctx: HandlerContext) -> None:
        schema = os.environ.get("EXAMPLE_SCHEMA", "public")
        users = f'"{schema}".users'
        # Lock the user's row: a concurrent delivery of another UserRegistered for the same user
        # (e.g. under a second consumer name) waits here instead of mailing in parallel.
        welcomed = await ctx.connection.fetchval(
            f"SELECT welcomed_at IS NOT NULL FROM {users} WHERE id = $1 FOR UPDATE", event.user_id
        )
        if welcomed:
            return
        mail = EmailMessage()
        mail["From"] = SENDER
        mail["To"] = event.email
        mail["Subject"] = f"Welcome, {event.name}!"
        # Stable across attempts: receivers can recognise a repeat.
        mail["Message-ID"] = f"<{ctx.message.id}@outboxer>"
        mail["X-Outbox-Message-Id"] = ctx.message.id
        mail.set_content(f"Hello {event.name},\n\nthanks for signing up.\n")
        # smtplib blocks: it runs in a worker thread, the consumer's loop stays free.
        await asyncio.to_thread(_send, mail)
        await ctx.connection.execute(
            f"UPDATE {users} SET welcomed_at = now() WHERE id = $1", event.user_id
        )


def _send(mail: EmailMessage) -> None:
    host = os.environ.get("SMTP_HOST", "127.0.0.1")
    port = int(os.environ.get("SMTP_PORT", "8025"))
    with smtplib.SMTP(host, port, timeout=30) as smtp:
        smtp.send_message(mail)
