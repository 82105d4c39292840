"""Whether the Hugging Face hub can be reached, decided fast, so an offline machine fails with a
clear message now rather than after minutes of retries. Corpora and tokenizers both ask here."""

from __future__ import annotations

import os
import socket
import urllib.parse

_PROXY_VARS = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")
TRUE = {"1", "ON", "YES", "TRUE"}


def offline_mode_requested() -> bool:
    """HF_HUB_OFFLINE or HF_DATASETS_OFFLINE is set to a true value."""
    return any(
        os.environ.get(v, "").upper() in TRUE for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
    )


def hub_unreachable() -> bool:
    """Fast DNS check so an offline machine fails now rather than after minutes of retries."""
    if any(os.environ.get(v) for v in _PROXY_VARS):
        return False  # name resolution is the proxy's job
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    host = urllib.parse.urlparse(endpoint).hostname
    if not host:
        return False
    try:
        socket.getaddrinfo(host, 443)
    except OSError:
        return True
    return False


def is_connection_error(exc: BaseException) -> bool:
    """``exc`` (or an exception in its chain) says the network or the hub was unreachable."""
    names = {"OfflineModeIsEnabled", "LocalEntryNotFoundError", "ConnectError", "ConnectTimeout"}
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ConnectionError | TimeoutError | socket.gaierror):
            return True
        if type(current).__name__ in names or "Couldn't reach" in str(current):
            return True
        current = current.__cause__ or current.__context__
    return False
