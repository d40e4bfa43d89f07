"""The REST API (django-ninja) under ``/api/v1/``, with its OpenAPI docs at ``/api/docs``."""
