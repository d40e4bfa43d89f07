"""Deployments in the operator console (read-only: deployments are immutable)."""

from django.contrib import admin

from deployments.models import ComponentMetadata, Deployment, DeploymentComponent


class ComponentInline(admin.TabularInline):
    model = DeploymentComponent
    extra = 0
    can_delete = False
    readonly_fields = ("component_name", "component_type", "component")


@admin.register(Deployment)
class DeploymentAdmin(admin.ModelAdmin):
    list_display = ("deployment_id", "status", "created_at", "last_active_at", "digest")
    list_filter = ("status",)
    readonly_fields = [f.name for f in Deployment._meta.fields]
    inlines = [ComponentInline]

    def has_add_permission(self, request):
        return False


@admin.register(ComponentMetadata)
class ComponentMetadataAdmin(admin.ModelAdmin):
    list_display = ("component_digest", "wit_origin")
    readonly_fields = [f.name for f in ComponentMetadata._meta.fields]

    def has_add_permission(self, request):
        return False
