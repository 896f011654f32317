"""`python -m epp.sidecar` / `epp-pd-sidecar`: the decode-side routing sidecar (see epp/sidecar/__init__.py)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import ssl
import sys
from pathlib import Path

from aiohttp import web
from prometheus_client import generate_latest

from epp.datalayer.datastore import Datastore
from epp.server.tls import TLSError, self_signed_dir
from epp.sidecar.allowlist import Allowlist, pool_source
from epp.sidecar.options import OptionsError, SidecarConfig, parse
from epp.sidecar.proxy import Metrics, SidecarProxy

log = logging.getLogger("epp.sidecar")


def _ssl_context(config: SidecarConfig) -> ssl.SSLContext | None:
    if not config.secure_proxy:
        return None
    cert_dir = Path(config.cert_path) if config.cert_path else self_signed_dir("pyepp-pd-sidecar")
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert_dir / "tls.crt", cert_dir / "tls.key")
    return ctx


async def serve(config: SidecarConfig, stop: asyncio.Event) -> None:
    datastore: Datastore | None = None
    tasks: list[asyncio.Task[None]] = []
    if config.enable_ssrf_protection and config.inference_pool_name:
        datastore = Datastore()
        source = pool_source(
            config.inference_pool_namespace, config.inference_pool_name, config.pool_group, config.kubeconfig
        )
        tasks.append(asyncio.create_task(source.run(datastore), name="sidecar-pool-watch"))
    allowlist = Allowlist(config.enable_ssrf_protection, config.allowed_prefillers, datastore)
    metrics = Metrics()
    ssl_ctx = _ssl_context(config)
    runners: list[web.AppRunner] = []
    for rank in range(config.data_parallel_size):
        proxy = SidecarProxy(config, allowlist, metrics, config.model_server_port + rank)
        runner = web.AppRunner(proxy.app(), access_log=None)
        await runner.setup()
        await web.TCPSite(runner, port=config.port + rank, ssl_context=ssl_ctx, reuse_address=True).start()
        runners.append(runner)
        log.info(
            "pd sidecar listening on :%d (%s) → local model server :%d; kv-connector %s, ssrf protection %s",
            config.port + rank, "https" if ssl_ctx else "http", config.model_server_port + rank,
            config.kv_connector, config.enable_ssrf_protection,
        )  # fmt: skip
    if config.metrics_port:

        async def metrics_handler(request: web.Request) -> web.Response:
            return web.Response(body=generate_latest(metrics.registry), content_type="text/plain")

        mapp = web.Application()
        mapp.router.add_get("/metrics", metrics_handler)
        mrunner = web.AppRunner(mapp, access_log=None)
        await mrunner.setup()
        await web.TCPSite(mrunner, port=config.metrics_port, reuse_address=True).start()
        runners.append(mrunner)
    try:
        await stop.wait()
    finally:
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        for r in runners:
            await r.cleanup()


def main(argv: list[str] | None = None) -> int:
    try:
        config, verbosity = parse(argv)
    except OptionsError as e:
        print(f"epp-pd-sidecar: {e}", file=sys.stderr)
        return 2
    level = logging.DEBUG if verbosity >= 4 else logging.INFO if verbosity >= 1 else logging.WARNING
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await serve(config, stop)

    try:
        asyncio.run(run())
    except (TLSError, OSError) as e:
        print(f"epp-pd-sidecar: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
