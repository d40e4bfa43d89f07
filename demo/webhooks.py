"""The demo's webhook endpoints (served under ``/hooks/`` by the web process when
``demo.webhooks`` is among ``OBELISK_COMPONENT_MODULES``; README.md, "Webhook endpoints").

- ``POST /hooks/welcome``: a REST API token; ``{"names": [...]}`` starts ``welcome_team`` and
  waits up to 5 s for its result (200), else answers 202 with the execution id. The
  ``Idempotency-Key`` header is required: the same key again is the same execution and the
  same answer.
- ``POST /hooks/github``: a GitHub push, signed with the secret in ``DEMO_GITHUB_WEBHOOK_SECRET``
  (settings or environment); greets the pusher, once per ``X-GitHub-Delivery``.
"""

from demo.activities import greet
from demo.workflows import welcome_team
from workers.webhooks import BearerToken, GitHubSignature, WebhookResponse, webhook


@webhook("POST", "/welcome", auth=BearerToken(), idempotency_header="Idempotency-Key")
def welcome(request):
    body = request.json()
    names = body.get("names") if isinstance(body, dict) else None
    if not isinstance(names, list) or not names:
        return WebhookResponse(400, {"code": "bad_request", "message": 'send {"names": ["Ada", ...]}'})
    return request.call(welcome_team, [names], timeout=5)


@webhook(
    "POST",
    "/github",
    auth=GitHubSignature(secret="DEMO_GITHUB_WEBHOOK_SECRET"),
    idempotency_header="X-GitHub-Delivery",
)
def github_push(request):
    body = request.json()
    pusher = body.get("pusher") if isinstance(body, dict) else None
    pusher = pusher.get("name") if isinstance(pusher, dict) else None
    return request.submit(greet, [pusher if isinstance(pusher, str) and pusher else "someone"])
