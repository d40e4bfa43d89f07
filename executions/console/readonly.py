"""The read-only base of every console page (executions, audit trail, delays, logs,
deployments, components).

The console shows what the store holds and only the store writes it, so no page adds,
changes or deletes a row. Each list links to a row with its id as it is, not in the
admin's ``_5F`` escaping, so the address can be copied. ``deployments.admin`` uses the
same mixin: the deployments app imports the console, never the reverse.

why: D51 (every change goes through the store, audited), D90 (ids as they are)
"""

from __future__ import annotations

from django.contrib.admin.views.main import ChangeList
from django.urls import reverse


class RawIdChangeList(ChangeList):
    """Links to each row with its id as it is, not in the admin's ``_5F`` escaping, so the
    address can be copied (D90). Obelisk's ids need no escaping in a path."""

    def url_for_result(self, result):
        opts = self.opts
        return reverse(
            f"admin:{opts.app_label}_{opts.model_name}_change",
            args=(getattr(result, self.pk_attname),),
            current_app=self.model_admin.admin_site.name,
        )


class ReadOnlyAdminMixin:
    """Before ``admin.ModelAdmin`` in a console page's bases: nothing to add, change or
    delete, and rows linked by their ids as they are."""

    def get_changelist(self, request, **kwargs):
        return RawIdChangeList

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
