"""`python -m e2e.sim --port 8000 --model Qwen/Qwen2.5-0.5B-Instruct [--kv-events-endpoint tcp://*:5557 ...]`.

Once serving, one JSON line goes to stdout with the bound addresses (ports 0 are resolved), for launchers:
`{"event": "ready", "http_port": ..., "kv_events_endpoint": ..., "kv_events_replay_endpoint": ..., "topic": ...}`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import sys
from typing import Any

from aiohttp import web

from e2e.sim.config import SimConfig, parse_args
from e2e.sim.server import Simulator, build_app


def _bound_port(site: web.TCPSite) -> int:
    server: Any = site._server
    return int(server.sockets[0].getsockname()[1])


async def serve(cfg: SimConfig) -> None:
    sim = Simulator(cfg)
    app = build_app(sim, manage_events=False)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, cfg.host, cfg.port, reuse_address=True)
    await site.start()
    if cfg.port == 0:
        cfg.port = _bound_port(site)
    await sim.start_events()
    pub = sim.publisher
    ready = {
        "event": "ready",
        "http_port": cfg.port,
        "kv_events_endpoint": pub.endpoint if pub else None,
        "kv_events_replay_endpoint": pub.replay_endpoint if pub else None,
        "topic": cfg.topic,
    }
    print(json.dumps(ready), flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await sim.stop_events()
    await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    cfg = parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    asyncio.run(serve(cfg))
    return 0


if __name__ == "__main__":
    sys.exit(main())
