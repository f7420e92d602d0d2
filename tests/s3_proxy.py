"""A fault-injecting HTTP proxy in front of moto's S3 server: the faults a real object store has on the way, so
a test sees what a client library (s3fs, botocore's retries) and ssdgen make of them. flows/ knows nothing of it.

    with S3FaultProxy(moto_endpoint) as proxy:          # or the `s3_faults` fixture (tests/conftest.py)
        proxy.add("PUT", r"/_lease/", "lose")             # the next PUT under _lease/ loses its answer
        ... point the client at proxy.endpoint (AWS_ENDPOINT_URL, as the fixture does)
        assert proxy.fired("lose") == 1

A rule matches a request by its method and a regular expression searched in its path as the client sent it:
path-style `/bucket/key`, the query included and percent-encoded (a listing of `run/_lease/` is
`/bucket?list-type=2&prefix=run%2F_lease%2F...`). It fires `times` times (None: on every match). The first rule
that still fires decides; requests no rule matches are forwarded as they are. Actions:

- "slowdown": answer 503 SlowDown (S3's throttling) without forwarding; botocore retries it.
- "error":    answer 500 InternalError without forwarding; botocore retries it.
- "delay":    wait `seconds`, then forward.
- "lose":     forward the request, let the store act on it, then close the connection without a response:
              the client cannot tell whether it happened (a lost answer), and retries it.
- "drop":     close the connection without forwarding (a request that never arrived).
- "deny":     refuse without forwarding, as S3 refuses a role without the permission: 403 AccessDenied, or for a
              DeleteObjects (POST ?delete) a 200 whose body refuses every key (S3 answers per key).

`log` holds (method, path, action) for every request, "forward" for those no rule touched.
"""

from __future__ import annotations

import http.client
import re
import socket
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

ACTIONS = ("slowdown", "error", "delay", "lose", "drop", "deny")
_CANNED = {  # what S3 itself answers, so the client's retry logic treats it as it would the real thing
    "slowdown": (503, "SlowDown", "Please reduce your request rate."),
    "error": (500, "InternalError", "We encountered an internal error. Please try again."),
}
# per hop, never forwarded (RFC 9110 7.6.1); Expect: the proxy answers 100-continue itself
_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade", "expect"}


@dataclass
class Rule:
    method: str
    path: str  # a regular expression, searched in the request's path and query
    action: str
    times: int | None = 1
    seconds: float = 0.0  # for "delay"

    def matches(self, method: str, path: str) -> bool:
        return (self.times is None or self.times > 0) and self.method in ("*", method) and \
            re.search(self.path, path) is not None


class S3FaultProxy:
    """An HTTP/1.1 proxy on 127.0.0.1 (a free port) forwarding to `upstream` (http://host:port), with fault rules.
    Start and stop it as a context manager; rules may be added and cleared while it runs."""

    def __init__(self, upstream: str):
        u = urlsplit(upstream)
        self.upstream = (u.hostname, u.port or 80)
        self.rules: list[Rule] = []
        self.log: list[tuple[str, str, str]] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._server.daemon_threads = True
        self._server.proxy = self
        self._thread = threading.Thread(target=self._server.serve_forever, name="s3-fault-proxy", daemon=True)

    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def add(self, method: str, path: str, action: str, times: int | None = 1, seconds: float = 0.0) -> Rule:
        """Add a rule (see the module docstring); method "*" matches any."""
        if action not in ACTIONS:
            raise ValueError(f"unknown action {action!r}; one of {', '.join(ACTIONS)}")
        rule = Rule(method.upper(), path, action, times, seconds)
        with self._lock:
            self.rules.append(rule)
        return rule

    def clear(self) -> None:
        with self._lock:
            self.rules.clear()

    def fired(self, action: str | None = None) -> int:
        """How many requests a rule acted on (of one action, or of any)."""
        with self._lock:
            return sum(1 for *_, a in self.log if a != "forward" and action in (None, a))

    def _take(self, method: str, path: str) -> Rule | None:
        """The rule that acts on this request, its count taken; logged."""
        with self._lock:
            rule = next((r for r in self.rules if r.matches(method, path)), None)
            if rule is not None and rule.times is not None:
                rule.times -= 1
            self.log.append((method, path, rule.action if rule else "forward"))
            return rule

    def _forward(self, method: str, path: str, headers, body: bytes) -> tuple[int, list, bytes]:
        conn = http.client.HTTPConnection(*self.upstream, timeout=60)
        try:
            conn.request(method, path, body=body if body or method in ("PUT", "POST") else None,
                         headers={k: v for k, v in headers.items() if k.lower() not in _HOP | {"content-length"}}
                         | ({"Content-Length": str(len(body))} if body or method in ("PUT", "POST") else {}))
            r = conn.getresponse()
            return r.status, r.getheaders(), r.read()
        finally:
            conn.close()

    def __enter__(self) -> "S3FaultProxy":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as S3 speaks: a dropped answer then breaks a reused connection

    def log_message(self, *args) -> None:  # quiet: the proxy's `log` says what happened
        pass

    def do_GET(self):
        self._relay()

    do_PUT = do_POST = do_DELETE = do_HEAD = do_GET

    def _relay(self) -> None:
        proxy: S3FaultProxy = self.server.proxy
        body = self._body()
        rule = proxy._take(self.command, self.path)
        action = rule.action if rule else "forward"
        if action in _CANNED:
            return self._canned(*_CANNED[action])
        if action == "drop":
            return self._hang_up()
        if action == "deny":
            return self._deny(body)
        if action == "delay":
            time.sleep(rule.seconds)
        status, headers, data = proxy._forward(self.command, self.path, self.headers, body)
        if action == "lose":
            return self._hang_up()
        self.send_response(status)
        for k, v in headers:
            if k.lower() not in _HOP and not (k.lower() == "content-length" and self.command != "HEAD"):
                self.send_header(k, v)
        if self.command != "HEAD":  # a HEAD keeps the upstream's length of the body it does not send
            self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            parts = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):  # trailers
                        pass
                    return b"".join(parts)
                parts.append(self.rfile.read(size))
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _canned(self, status: int, code: str, message: str) -> None:
        body = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code><Message>{message}</Message>'
                f"<RequestId>s3-fault-proxy</RequestId></Error>").encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _deny(self, body: bytes) -> None:
        if self.command != "POST" or "?delete" not in self.path:
            return self._canned(403, "AccessDenied", "Access Denied")
        errors = "".join(f"<Error><Key>{k}</Key><Code>AccessDenied</Code><Message>Access Denied</Message></Error>"
                         for k in re.findall(rb"<Key>(.*?)</Key>", body) for k in [k.decode()])
        data = (f'<?xml version="1.0" encoding="UTF-8"?>\n<DeleteResult xmlns="http://s3.amazonaws.com/doc/'
                f'2006-03-01/">{errors}</DeleteResult>').encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _hang_up(self) -> None:
        """Close the connection with no response at all."""
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
