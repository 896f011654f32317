"""endpoint-notification-source (llm-d; GIE's k8s-notification-source): accepted so llm-d configs load. Plugins
that need endpoint changes subscribe to the Datastore through PluginContext.endpoints themselves."""

from __future__ import annotations

from epp.framework import Plugin


class EndpointNotificationSource(Plugin):
    type_name = "endpoint-notification-source"
    aliases = ("k8s-notification-source",)
