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

from e2e.sim.config import SimConfig, parse_args
from e2e.sim.server import start_server


async def serve(cfg: SimConfig) -> None:
    running = await start_server(cfg)
    print(json.dumps({"event": "ready", **running.ready_info()}), flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await running.close()


def main(argv: list[str] | None = None) -> int:
    cfg = parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    asyncio.run(serve(cfg))
    return 0


if __name__ == "__main__":
    sys.exit(main())
