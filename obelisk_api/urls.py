"""Include in a project's URLs: ``path("api/", include("obelisk_api.urls"))``.

Every django-ninja view is wrapped by ``parsing.guard`` (the body size, announced, is
refused before the body is read; HEAD answers as GET); any other path under the mount point,
whatever it holds (a newline too) and whatever the method (no CSRF check: nothing is done),
is a JSON 404; and ``/api/`` itself leads to the docs.
"""

from django.urls import include, path, re_path
from django.views.decorators.csrf import csrf_exempt
from django.views.generic import RedirectView

from obelisk_api.api import api
from obelisk_api.errors import json_error
from obelisk_api.parsing import guard

_patterns, _app, _namespace = api.urls  # not `app_name`: Django would read it as this module's
for pattern in _patterns:
    pattern.callback = guard(pattern.callback)


@csrf_exempt  # it changes nothing; Django's CSRF check would answer its HTML page first
def not_found(request, rest=""):
    return json_error(404, "not_found", f"no API route {request.method} {request.path}")


urlpatterns = [
    path("", RedirectView.as_view(pattern_name="obelisk_api:openapi-view"), name="api-home"),
    path("", include((_patterns, _app), namespace=_namespace)),
    re_path(r"^(?P<rest>[\s\S]*)$", not_found),  # not `.*`: a newline must match too
]
