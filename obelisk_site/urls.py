"""URL configuration: the admin is the operator console; the bare site leads to it.

The upgrade dry-run report (``upgrade_report``) is a page of the console under the admin's
address and login, mounted before the admin's own URLs (whose catch-all would take it).

The webhook endpoints the component modules declare are served under
``OBELISK["WEBHOOK_PREFIX"]`` (``hooks/``) by ``obelisk_api.webhooks`` (D119).

The admin's "View site" link goes to the REST API's docs (``/api/docs``) and is labelled
so (``templates/admin/base_site.html``): the console has no other public site (D92).
"""

from django.contrib import admin
from django.urls import include, path, reverse_lazy
from django.views.generic import RedirectView

from obelisk_api import webhooks
from obelisk_site.upgrade_report import upgrade_report

admin.site.site_header = "Obelisk for Django"
admin.site.site_title = "Obelisk"
admin.site.index_title = "Operator console"
admin.site.site_url = reverse_lazy("obelisk_api:openapi-view")

urlpatterns = [
    path("", RedirectView.as_view(pattern_name="admin:index"), name="home"),
    path(
        "admin/obelisk_deployments/deployment/<str:deployment_id>/upgrade-dry-run/",
        admin.site.admin_view(upgrade_report),
        name="obelisk_upgrade_dry_run",
    ),
    path("admin/", admin.site.urls),
    path("api/", include("obelisk_api.urls")),
    webhooks.url_pattern(),  # the components' @webhook endpoints under OBELISK["WEBHOOK_PREFIX"] (D119)
]
