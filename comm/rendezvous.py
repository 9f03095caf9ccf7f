"""Rendezvous stores: a torch.distributed TCPStore served on a socket we bound, on one host only
(DeepSpeed's process group and the weight-sync group meet on these). Imports no Ray."""

from __future__ import annotations

import socket
from datetime import timedelta


def listen_socket(host: str) -> socket.socket:
    """A listening TCP socket on ``host`` only, at a port the OS picks: what a TCPStore that
    should not be reachable beyond ``host`` serves on (:func:`tcp_store`). Keep it open until the
    store is built (nobody else can take the port meanwhile)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.bind((host, 0))
    sock.listen(128)
    return sock


def tcp_store(
    host: str,
    port: int,
    world_size: int | None,
    *,
    timeout: timedelta,
    listener: socket.socket | None = None,
):
    """A torch.distributed TCPStore at ``host:port``: the server when ``listener`` (from
    :func:`listen_socket`) is given, else a client. torch's own server binds every interface
    whatever host it is told; on a socket we bound it listens where the socket does."""
    import torch.distributed as dist

    if listener is None:
        return dist.TCPStore(host, port, world_size, is_master=False, timeout=timeout)
    store = dist.TCPStore(
        host,
        port,
        world_size,
        is_master=True,
        timeout=timeout,
        master_listen_fd=listener.fileno(),
    )
    listener.detach()  # the store owns the descriptor now: a collected socket would close it
    return store
