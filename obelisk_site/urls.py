"""URL configuration: the admin is the operator console."""

from django.contrib import admin
from django.urls import include, path

admin.site.site_header = "Obelisk for Django"
admin.site.site_title = "Obelisk"
admin.site.index_title = "Operator console"

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/", include("obelisk_api.urls")),
]
