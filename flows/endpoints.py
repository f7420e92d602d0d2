"""Whether a storage endpoint was reached, and a quick probe that finds out in seconds.

A wrong endpoint (`AWS_ENDPOINT_URL` pointing where nothing listens, a misspelt host) otherwise surfaces only
after s3fs's and botocore's retries with backoff (~15 s) as a raw botocore error. `probe` sends one request
through a client of its own with a short connect timeout and one retry (`PROBE_CONFIG`); the run's cached
filesystem, and so every successful run, keeps its retries. `unreachable` tells an endpoint that was never
reached (refused, unknown host, connect timeout) from every other storage error, by the exception names of
botocore and aiohttp (neither is imported here) and the OS errors they wrap; a reset or broken connection does
not count (the endpoint was reached). `endpoint_of` names the endpoint without user info or path, so no
credential reaches a message.
"""

from __future__ import annotations

import errno
import os
import urllib.parse

UNREACHABLE = {"EndpointConnectionError", "ConnectTimeoutError", "ProxyConnectionError", "ClientConnectorError",
               "ClientConnectorDNSError", "gaierror", "ConnectionRefusedError"}
ERRNOS = {errno.ECONNREFUSED: "connection refused", errno.EHOSTUNREACH: "host unreachable",
          errno.ENETUNREACH: "network unreachable", errno.ETIMEDOUT: "connect timed out"}
PROBE_CONFIG = {"connect_timeout": 2, "retries": {"total_max_attempts": 2, "mode": "standard"}}  # botocore Config


def causes(exc: BaseException):
    """exc and what it wraps: __cause__ and __context__, botocore's kwargs['error'], aiohttp's os_error."""
    seen, todo = set(), [exc]
    while todo:
        e = todo.pop(0)
        if not isinstance(e, BaseException) or id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        todo += [e.__cause__, e.__context__, (getattr(e, "kwargs", None) or {}).get("error"),
                 getattr(e, "os_error", None)]


def unreachable(exc: BaseException) -> str | None:
    """Why the endpoint was not reached ("connection refused", "host not found", ...), or None if it was."""
    chain = list(causes(exc))
    named = any(c.__name__ in UNREACHABLE for e in chain for c in type(e).__mro__)
    if not named and not any(isinstance(e, OSError) and e.errno in ERRNOS for e in chain):
        return None
    for e in chain:
        if isinstance(e, OSError) and e.errno in ERRNOS:
            return ERRNOS[e.errno]
        if type(e).__name__ in ("gaierror", "ClientConnectorDNSError"):
            return "host not found"
        if "Timeout" in type(e).__name__ or isinstance(e, TimeoutError):
            return "connect timed out"
    return "cannot connect"


def endpoint_of(exc: BaseException, fs=None) -> str | None:
    """scheme://host[:port] of the endpoint tried (the error's, else the filesystem's or the environment's)."""
    found = [(getattr(e, "kwargs", None) or {}).get("endpoint_url") for e in causes(exc)]
    found += [getattr(fs, "endpoint_url", None), (getattr(fs, "client_kwargs", None) or {}).get("endpoint_url"),
              os.environ.get("AWS_ENDPOINT_URL_S3"), os.environ.get("AWS_ENDPOINT_URL")]
    for url in found:
        if isinstance(url, str) and "://" in url:
            u = urllib.parse.urlsplit(url)
            try:
                port = f":{u.port}" if u.port else ""
            except ValueError:  # a malformed port: name the host only
                port = ""
            return f"{u.scheme}://{u.hostname}{port}"
    return None


def is_s3(fs) -> bool:
    protocols = fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)
    return any(p in ("s3", "s3a") for p in protocols)


def probe(fs, path: str) -> BaseException | None:
    """S3 only: one quick request for `path` (its part before any glob); the error if the endpoint was not
    reached, else None, whatever the answer (found, not found, denied: the listing reports those)."""
    if not is_s3(fs):
        return None
    options = dict(fs.storage_options)
    options["config_kwargs"] = {**(options.get("config_kwargs") or {}), **PROBE_CONFIG}
    head = min((path.index(c) for c in "*?[" if c in path), default=len(path))
    try:
        quick = type(fs)(**options, skip_instance_cache=True)  # not the cached instance the run goes on with
        quick.retries = 1  # s3fs's own retry loop, around botocore's
        quick.info(path[:head] or path)
    except Exception as e:
        return e if unreachable(e) is not None else None
    return None
