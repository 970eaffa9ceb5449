"""The shop's own tables: customers and their orders."""

from django.db import models


class Customer(models.Model):
    email = models.EmailField(unique=True)
    name = models.CharField(max_length=200)


class Order(models.Model):
    customer = models.ForeignKey(Customer, on_delete=models.PROTECT)
    item = models.CharField(max_length=200)
    quantity = models.PositiveIntegerField()
    total_cents = models.PositiveIntegerField()
    placed_at = models.DateTimeField(auto_now_add=True)
