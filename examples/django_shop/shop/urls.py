"""The shop's endpoints and the admin (where the dead letters are)."""

from django.contrib import admin
from django.urls import path
from orders import views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("customers", views.register),
    path("orders", views.place_order),
    path("async/orders", views.place_order_async),
]
