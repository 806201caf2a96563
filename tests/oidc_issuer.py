"""An OIDC issuer for tests: real signing keys made here, and a real HTTP server on a free
127.0.0.1 port, in a thread, serving the OpenID configuration and the JWK set.

Tokens are signed with PyJWT from keys `cryptography` generates; the JWK set can be
rotated (keys added and removed) while the server runs, and it counts the reads of it.
"""

from __future__ import annotations

import base64
import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from jwt.algorithms import ECAlgorithm, RSAAlgorithm

POLL_S = 0.05
JWKS_PATH = "/jwks.json"
DISCOVERY_PATH = "/.well-known/openid-configuration"


class SigningKey:
    """One private key (RSA for RS256, P-256 for ES256) and its public JWK."""

    def __init__(self, algorithm: str = "RS256") -> None:
        self.algorithm, self.kid = algorithm, uuid.uuid4().hex[:12]
        if algorithm == "RS256":
            self.private: Any = rsa.generate_private_key(public_exponent=65537, key_size=2048)
            public = json.loads(RSAAlgorithm.to_jwk(self.private.public_key()))
        else:
            self.private = ec.generate_private_key(ec.SECP256R1())
            public = json.loads(ECAlgorithm.to_jwk(self.private.public_key()))
        self.jwk = public | {"kid": self.kid, "use": "sig", "alg": algorithm}


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class Issuer:
    """Signs tokens and serves its keys; `audience` is the gateway's."""

    def __init__(self, audience: str = "draftgate-test") -> None:
        self.audience = audience
        self.keys = [SigningKey("RS256")]
        self._lock = threading.Lock()
        self.jwks_reads = 0
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": POLL_S}, daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_port}"

    def token(self, key: SigningKey | None = None, lifetime_s: float = 300, **claims: Any) -> str:
        """A token signed with `key` (the first key by default), valid for `lifetime_s`
        from now; `claims` override the defaults (iss, aud, sub, exp, iat)."""
        key = key or self.keys[0]
        now = int(time.time())
        defaults = {"iss": self.url, "aud": self.audience, "sub": "someone", "iat": now}
        payload = defaults | {"exp": now + int(lifetime_s)} | claims
        payload = {name: value for name, value in payload.items() if value is not None}
        return jwt.encode(payload, key.private, algorithm=key.algorithm, headers={"kid": key.kid})

    def unsigned(self, **claims: Any) -> str:
        """A token with `alg: none` and no signature, made by hand."""
        header = b64url(json.dumps({"alg": "none", "typ": "JWT"}).encode())
        now = int(time.time())
        payload = {"iss": self.url, "aud": self.audience, "exp": now + 300} | claims
        return f"{header}.{b64url(json.dumps(payload).encode())}."

    def rotate(self, algorithm: str = "RS256") -> tuple[SigningKey, SigningKey]:
        """Replace the first key with a new one; (the removed key, the new key)."""
        new = SigningKey(algorithm)
        with self._lock:
            old, self.keys = self.keys[0], [new, *self.keys[1:]]
        return old, new

    def _document(self, path: str) -> dict[str, Any] | None:
        with self._lock:
            if path == JWKS_PATH:
                self.jwks_reads += 1
                return {"keys": [k.jwk for k in self.keys]}
        if path == DISCOVERY_PATH:
            return {"issuer": self.url, "jwks_uri": self.url + JWKS_PATH}
        return None

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        issuer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                document = issuer._document(self.path)
                body = json.dumps(document).encode() if document is not None else b""
                self.send_response(200 if document is not None else 404)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass  # the test's output stays the test's

        return Handler

    def start(self) -> Issuer:
        self._thread.start()
        return self

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
