"""URLs with a project's own AdminSite beside admin.site (tests/test_admin_site.py)."""

from django.contrib import admin
from django.urls import path

from django_pgqueue.admin import register


class OpsSite(admin.AdminSite):
    site_header = "Operations"


ops_site = OpsSite(name="ops")
register(ops_site)

urlpatterns = [path("admin/", admin.site.urls), path("ops/", ops_site.urls)]
