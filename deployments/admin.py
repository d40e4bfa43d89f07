"""Deployments and components in the operator console: read-only (deployments are
immutable, and executions point at them), with the functions each exports, their parameter
schemas, the worker clusters serving a deployment and links to the executions pinned to it.

``status`` and ``last_active_at`` are what ``t_deployment`` says: a worker activates its
deployment when it starts (``store.activate_deployment``), so ``last_active_at`` is
the last *activation*, not a heartbeat; the clusters' own heartbeats (``t_cluster``) say
who serves a deployment now. The pages are the console's read-only ones
(``executions.console.readonly``); the execution counts stop at the list's cap.

A deployment's page has an "Upgrade dry run" form: a select of the other deployments that
share a component with it (the active one chosen), sent with GET to the report page,
``obelisk_site/upgrade_report.py``, which runs the replay: the console's packages do not
import the runtime (``workers``), so this page only links to it.

why: D90 (ids as they are in links), D94 (capped counts), D111 (the upgrade)
"""

from __future__ import annotations

import json

from django.contrib import admin
from django.contrib.admin.utils import unquote
from django.urls import NoReverseMatch, reverse
from django.utils.html import format_html, format_html_join

from executions import catalog, display, errors, store
from executions.console.limits import capped_count
from executions.console.readonly import ReadOnlyAdminMixin
from executions.models import ComponentMetadata, Deployment, DeploymentComponent

UPGRADE_REPORT_URL = "obelisk_upgrade_dry_run"  # obelisk_site/urls.py
MAX_UPGRADE_TARGETS = 50  # newest first
STATUS_COLOURS = {"active": ("#2e7d32", "#fff"), "enqueued": ("#1565c0", "#fff"), "inactive": ("#9e9e9e", "#fff")}


def component_label(name: str, component_type: str, digest: str) -> str:
    """``name (type) sha256:0123456789ab…``: what a ``DeploymentComponent`` row is."""
    return f"{name} ({component_type}) {digest[:19]}…"


def executions_url(**query) -> str:
    base = reverse("admin:obelisk_executions_executionstate_changelist")
    return base + "?" + "&".join(f"{key}={value}" for key, value in query.items())


def _schema(schema) -> str:
    return json.dumps(schema, ensure_ascii=False, separators=(", ", ": ")) if schema else "any"


def functions_table(exports) -> str:
    """``(ffqn, [(name, schema, default or None)], return schema)`` rows as an HTML table."""
    rows = format_html_join(
        "",
        "<tr><td><code>{}</code></td><td>{}</td><td><code>{}</code></td></tr>",
        (
            (
                ffqn,
                format_html_join(
                    "",
                    "<div><code>{}</code>: <code>{}</code>{}</div>",
                    ((name, _schema(schema), default) for name, schema, default in parameters),
                )
                or "—",
                _schema(returns),
            )
            for ffqn, parameters, returns in exports
        ),
    )
    if not rows:
        return "—"
    return format_html(
        '<table class="obelisk-functions"><thead><tr><th>function</th><th>parameters (JSON Schema)</th>'
        "<th>returns</th></tr></thead><tbody>{}</tbody></table>",
        rows,
    )


@admin.register(Deployment)
class DeploymentAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("deployment_id", "status_badge", "created", "last_activated", "component_list", "executions")
    list_filter = ("status",)
    ordering = ("-created_at",)
    _details = (
        "deployment_id",
        "status_badge",
        "created",
        "last_activated",
        "workers",
        "description",
        "created_by",
        "obelisk_version",
        "digest",
        "executions",
    )
    fieldsets = (
        (None, {"fields": _details}),
        ("Components", {"fields": ("components_table",)}),
        ("Functions", {"fields": ("functions",)}),
        ("Manifest", {"classes": ("collapse",), "fields": ("deployment_toml",)}),
    )
    readonly_fields = (*_details, "components_table", "functions", "deployment_toml")

    def change_view(self, request, object_id, form_url="", extra_context=None):
        return super().change_view(
            request, object_id, form_url, {**(extra_context or {}), **_upgrade(unquote(object_id))}
        )

    @admin.display(description="status", ordering="status")
    def status_badge(self, obj):
        background, colour = STATUS_COLOURS.get(obj.status, ("#555", "#fff"))
        return format_html(
            '<span style="background:{};color:{};padding:1px 8px;border-radius:10px;font-size:11px;'
            'font-weight:600">{}</span>',
            background,
            colour,
            obj.status,
        )

    @admin.display(description="created (UTC)", ordering="created_at")
    def created(self, obj):
        return display.exact_time(obj.created_at)

    @admin.display(description="last activated (UTC)", ordering="last_active_at")
    def last_activated(self, obj):
        """When a worker last activated it at start; not a heartbeat (see ``workers``)."""
        if obj.last_active_at is None:
            return "never"
        return display.exact_time(obj.last_active_at)

    @admin.display(description="worker clusters (heartbeats, last day)")
    def workers(self, obj):
        clusters = [c for c in store.list_clusters() if c.deployment_id == obj.deployment_id]
        if not clusters:
            return "none reported in the last day"
        return format_html_join(
            "",
            "<div>{}:{} — {}, last seen {} UTC, {} process(es), {} running</div>",
            (
                (
                    c.hostname,
                    c.pid,
                    "alive" if c.alive else ("stopped" if c.stopped_at else "gone"),
                    display.exact_time(c.last_seen_at),
                    c.processes,
                    c.running,
                )
                for c in clusters
            ),
        )

    @admin.display(description="components")
    def component_list(self, obj):
        return format_html_join(
            "",
            "<div>{}</div>",
            ((component_label(c.component_name, c.component_type, c.component_id),) for c in self._components(obj)),
        )

    @admin.display(description="executions")
    def executions(self, obj):
        return _executions_link(
            store.ExecutionFilter(deployment_id=obj.deployment_id, show_derived=True),
            executions_url(deployment=obj.deployment_id),
        )

    def _components(self, obj):
        return list(DeploymentComponent.objects.filter(deployment=obj).order_by("component_name"))

    @admin.display(description="components")
    def components_table(self, obj):
        rows = format_html_join(
            "",
            '<tr><td>{}</td><td>{}</td><td><a href="{}"><code>{}</code></a></td><td><a href="{}">executions</a></td></tr>',
            (
                (
                    c.component_name,
                    c.component_type,
                    reverse("admin:obelisk_deployments_componentmetadata_change", args=[c.component_id]),
                    c.component_id,
                    executions_url(component=c.component_id),
                )
                for c in self._components(obj)
            ),
        )
        return format_html(
            "<table><thead><tr><th>name</th><th>type</th><th>digest</th><th></th></tr></thead>{}</table>", rows
        )

    @admin.display(description="functions")
    def functions(self, obj):
        try:
            stored = catalog.list_functions(obj.deployment_id)
        except errors.StoreError as error:
            return str(error)
        return functions_table(
            (
                f.ffqn,
                [(p.name, p.schema, "" if p.required else f" = {json.dumps(p.default)}") for p in f.parameters],
                f.return_schema,
            )
            for f in stored
        )


@admin.register(ComponentMetadata)
class ComponentMetadataAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("component_digest", "names", "wit_origin", "executions")
    search_fields = ("component_digest",)
    fields = ("component_digest", "names", "deployments", "executions", "functions", "wit_origin", "wit_text")
    readonly_fields = fields

    @admin.display(description="name (type) in deployments")
    def names(self, obj):
        pairs = sorted(
            set(DeploymentComponent.objects.filter(component=obj).values_list("component_name", "component_type"))
        )
        return ", ".join(f"{name} ({kind})" for name, kind in pairs) or "—"

    @admin.display(description="deployments")
    def deployments(self, obj):
        ids = (
            DeploymentComponent.objects.filter(component=obj)
            .order_by("-deployment__created_at")
            .values_list("deployment_id", "deployment__status")
        )
        return format_html_join(
            "",
            '<div><a href="{}">{}</a> ({})</div>',
            ((reverse("admin:obelisk_deployments_deployment_change", args=[d]), d, status) for d, status in ids),
        )

    @admin.display(description="executions")
    def executions(self, obj):
        return _executions_link(
            store.ExecutionFilter(component_digest=obj.component_digest, show_derived=True),
            executions_url(component=obj.component_digest),
        )

    @admin.display(description="exported functions")
    def functions(self, obj):
        return functions_table(
            (
                export.get("ffqn", "?"),
                [
                    (p.get("name"), p.get("type"), f" = {json.dumps(p['default'])}" if "default" in p else "")
                    for p in export.get("parameter_types", [])
                ],
                export.get("return_type"),
            )
            for export in obj.exports_json or []
        )

    @admin.display(description="interface")
    def wit_text(self, obj):
        return format_html('<pre style="white-space:pre-wrap">{}</pre>', obj.wit)


def upgrade_targets(deployment_id: str) -> list[dict]:
    """The other deployments naming a component of ``deployment_id`` (newest first): what its
    in-flight executions could be upgraded to; the active one is ``selected``, else the newest."""
    names = DeploymentComponent.objects.filter(deployment_id=deployment_id).values("component_name")
    rows = (
        Deployment.objects.filter(components__component_name__in=names)
        .exclude(pk=deployment_id)
        .distinct()
        .order_by("-created_at")
        .values_list("deployment_id", "status", "created_at", "description")[:MAX_UPGRADE_TARGETS]
    )
    targets = [
        {"id": d, "status": status, "created": display.exact_time(created), "description": description or ""}
        for d, status, created, description in rows
    ]
    chosen = next((t for t in targets if t["status"] == "active"), targets[0] if targets else None)
    for target in targets:
        target["selected"] = target is chosen
    return targets


def _upgrade(deployment_id: str) -> dict:
    """The page's "Upgrade dry run" form: the report's address and the targets to choose from."""
    try:
        url = reverse(UPGRADE_REPORT_URL, args=[deployment_id])
    except NoReverseMatch:  # a project that does not mount obelisk_site's URLs
        return {}
    return {"upgrade_url": url, "upgrade_targets": upgrade_targets(deployment_id)}


def _executions_link(filters, url):
    """A link to the executions list with how many there are, counted up to the list's own
    cap (an index range that stops there, D94): a page's count never reads the table whole."""
    count, capped = capped_count(store.filter_executions(filters))
    return format_html('<a href="{}">{}{} execution(s)</a>', url, "more than " if capped else "", count)
