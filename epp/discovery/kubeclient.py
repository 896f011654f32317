"""Kubernetes client configuration: explicit kubeconfig, else the in-cluster service account, else ~/.kube/config."""

from __future__ import annotations

import logging

from kubernetes_asyncio import client, config
from kubernetes_asyncio.config.config_exception import ConfigException
from kubernetes_asyncio.config.incluster_config import SERVICE_CERT_FILENAME, SERVICE_TOKEN_FILENAME

log = logging.getLogger(__name__)


async def load_configuration(
    kubeconfig: str | None = None,
    *,
    context: str | None = None,
    token_file: str = SERVICE_TOKEN_FILENAME,
    ca_file: str = SERVICE_CERT_FILENAME,
) -> client.Configuration:
    """Never touches the library's global default configuration, so several clients can coexist in one process."""
    cfg = client.Configuration()
    if kubeconfig:
        await config.load_kube_config(
            config_file=kubeconfig, context=context, client_configuration=cfg, persist_config=False
        )
        log.info("kubernetes: using kubeconfig %s (%s)", kubeconfig, cfg.host)
        return cfg
    try:
        config.load_incluster_config(client_configuration=cfg, token_filename=token_file, cert_filename=ca_file)
        log.info("kubernetes: using in-cluster service account (%s)", cfg.host)
        return cfg
    except ConfigException as e:
        log.info("kubernetes: not in a cluster (%s); trying the default kubeconfig", e)
    await config.load_kube_config(context=context, client_configuration=cfg, persist_config=False)
    return cfg


async def api_client(kubeconfig: str | None = None, *, context: str | None = None) -> client.ApiClient:
    return client.ApiClient(await load_configuration(kubeconfig, context=context))
