"""Include in a project's URLs: ``path("api/", include("obelisk_api.urls"))``."""

urlpatterns = []
