"""Free loopback ports, released before the caller's server binds them.

`free_port`/`free_ports` bind port 0 and read it back: a tiny race is possible (callers retry on bind errors).
`free_port_run` finds consecutive ports below the kernel's ephemeral range, where no outgoing connection takes one.
"""

from __future__ import annotations

import os
import socket


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """n distinct free ports (all held open until every one is chosen, so they differ)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            socks.append(s)
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


_handed_out: set[int] = set()  # ports free_port_run returned in this process (not returned twice)


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port_run(n: int, host: str = "127.0.0.1") -> int:
    """A base port p with p..p+n-1 free on `host`, below the kernel's ephemeral range, for a server that binds
    consecutive ports (vLLM's data-parallel ranks, `--workers`' metrics ports).

    The ports are released before the server binds them. Inside the ephemeral range another process's outgoing
    connection can take one in between (two CI runs failed so); below it only an explicit bind can."""
    low = _ephemeral_low()
    first = max(1024, low - 12000)
    span = low - n - first
    start = os.getpid() % 500 * 20  # processes running side by side start apart
    for k in range(span):  # a prime stride: every base once (unless the span is a multiple of it)
        base = first + (start + k * 97) % span
        run = range(base, base + n)
        if _handed_out.intersection(run):
            continue
        socks = []
        try:
            for p in run:
                s = socket.socket()
                socks.append(s)
                s.bind((host, p))
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
        _handed_out.update(run)
        return base
    raise RuntimeError(f"no run of {n} free ports below {low}")
