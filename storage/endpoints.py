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
NO_CREDENTIALS = {"NoCredentialsError", "PartialCredentialsError"}  # botocore's: nothing, or half, to sign with
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


def no_credentials(exc: BaseException) -> bool:
    """Whether botocore found no credentials to sign with (no AWS_* variables, profile or role): its own
    exception, not an OSError, raised wherever an S3 store is first touched (a run's lease, status's config)."""
    return any(type(e).__name__ in NO_CREDENTIALS for e in causes(exc))


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


def refused(exc: BaseException) -> str | None:
    """The store's code for refused credentials or access ("InvalidAccessKeyId / 403", "403 Forbidden"), or
    None when exc is no such refusal. s3fs turns a 403 into PermissionError; botocore's error carries the code."""
    chain = list(causes(exc))
    if not any(isinstance(e, PermissionError) for e in chain):
        return None
    for e in chain:
        error = (getattr(e, "response", None) or {}).get("Error") or {}
        code = str(error.get("Code") or "")
        if code and not code.isdigit():
            return f"{code} / 403"
    return "403 Forbidden"


def check_bucket(url: str, fs, bucket: str) -> None:
    """The bucket exists and the store lets these credentials in; a ValueError of one line naming which failed:
    an endpoint not reached, credentials refused, or a missing bucket (s3fs's `exists` says False for all)."""
    if (e := probe(fs, bucket)) is not None:
        where = endpoint_of(e, fs)
        raise ValueError(f"{url}: could not reach the storage endpoint{f' {where}' if where else ''} "
                         f"({unreachable(e)}); check AWS_ENDPOINT_URL / the endpoint_url setting")
    try:
        fs.info(bucket)
    except FileNotFoundError:
        raise ValueError(f"{url}: bucket {bucket!r} does not exist (ssdgen never creates buckets); create it, or "
                         "fix the URL") from None
    except OSError as e:
        if (code := refused(e)) is None:
            raise
        raise ValueError(f"{url}: the store refused the credentials for bucket {bucket!r} ({code}); check "
                         "AWS_ACCESS_KEY_ID / AWS_PROFILE and the bucket's policy") from None
