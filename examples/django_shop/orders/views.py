"""The shop's endpoints: each writes its rows and its event in one transaction.

``transaction.atomic()`` on Django's connection holds both: if the order is not saved, no
e-mail is ever sent; if it is, the relay publishes its event (at least once) after the commit.
"""

from __future__ import annotations

import json
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import transaction
from django.forms.models import model_to_dict
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from orders.events import CustomerRegistered, OrderPlaced
from orders.models import Customer, Order
from outboxer.integrations.django import enqueue

PRICES = {"tea": 450, "coffee": 390}


def shop_database() -> str:
    """The database alias of the orders (and of their outbox): ``SHOP_ORDERS_DATABASE``."""
    return str(getattr(settings, "SHOP_ORDERS_DATABASE", "default"))


def register_customer(email: str, name: str) -> Customer:
    using = shop_database()
    with transaction.atomic(using=using):
        customer = Customer.objects.using(using).create(email=email, name=name)
        # a pydantic model as the payload
        event = CustomerRegistered(customer_id=customer.pk, email=email, name=name)
        enqueue("customers", event, key=customer.pk, type="CustomerRegistered", using=using)
    return customer


def place(email: str, item: str, quantity: int) -> Order:
    """Save an order and its OrderPlaced event, all or nothing."""
    using = shop_database()
    with transaction.atomic(using=using):
        customer = Customer.objects.using(using).get(email=email)
        order = Order.objects.using(using).create(
            customer=customer, item=item, quantity=quantity, total_cents=PRICES[item] * quantity
        )
        # a dataclass as the payload, from some of the model's fields; the key keeps one
        # customer's events in order
        fields = model_to_dict(order, fields=["item", "quantity", "total_cents"])
        event = OrderPlaced(order_id=order.pk, email=email, **fields)
        enqueue("orders", event, key=customer.pk, type="OrderPlaced", using=using)
    return order


def _body(request: HttpRequest) -> dict[str, Any]:
    body = json.loads(request.body)
    if not isinstance(body, dict):
        raise ValueError("a JSON object is expected")
    return body


@csrf_exempt
@require_POST
def register(request: HttpRequest) -> JsonResponse:
    body = _body(request)
    customer = register_customer(body["email"], body["name"])
    return JsonResponse({"customer": customer.pk}, status=201)


@csrf_exempt
@require_POST
def place_order(request: HttpRequest) -> JsonResponse:
    body = _body(request)
    order = place(body["email"], body["item"], int(body["quantity"]))
    return JsonResponse({"order": order.pk}, status=201)


@csrf_exempt
@require_POST
async def place_order_async(request: HttpRequest) -> JsonResponse:
    # Django runs transactions on synchronous connections only: the whole transaction (ORM
    # writes and enqueue) is one function run by sync_to_async, in Django's thread for the
    # database (thread_sensitive, the default), never atomic() around awaits.
    body = _body(request)
    order = await sync_to_async(place)(body["email"], body["item"], int(body["quantity"]))
    return JsonResponse({"order": order.pk}, status=201)
