"""URL configuration: the admin is the operator console; the bare site leads to it.

The admin's "View site" link goes to the REST API's docs (``/api/docs``) and is labelled
so (``templates/admin/base_site.html``): the console has no other public site (D92).
"""

from django.contrib import admin
from django.urls import include, path, reverse_lazy
from django.views.generic import RedirectView

admin.site.site_header = "Obelisk for Django"
admin.site.site_title = "Obelisk"
admin.site.index_title = "Operator console"
admin.site.site_url = reverse_lazy("obelisk_api:openapi-view")

urlpatterns = [
    path("", RedirectView.as_view(pattern_name="admin:index"), name="home"),
    path("admin/", admin.site.urls),
    path("api/", include("obelisk_api.urls")),
]
