"""Bearer tokens (JWTs an OIDC issuer signs) as `/v1` credentials beside API keys.

A token is told from an API key by its shape (three dot-separated parts; a key is `dg-` and
URL-safe base64, which has no dot). Its check: an accepted, asymmetric algorithm (before any
key is looked up), the issuer's key its `kid` names (gateway/relay/jwks.py), the signature,
`iss`, `aud`, `exp` and `nbf` (with a small leeway). A token that passes names its team by
the team claim and its end user by the user claim; it is served as the team itself (the
team's `team_caller` view in the snapshot: its limits and allowed models, no key). A check
that passed is remembered until the token expires (a bounded number of tokens), so a client
sending the same token again costs a dictionary lookup, not a signature.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx
import jwt
from jwt import PyJWK

from gateway.apikeys import KEY_PREFIX
from gateway.errors import InvalidToken, TeamNotFound, TokenExpired
from gateway.registry import KeyView, Snapshot
from gateway.relay.attribution import END_USER_CHARS
from gateway.relay.jwks import SigningKeys
from gateway.settings import Settings

REMEMBERED = 4096  # tokens whose passed check is remembered (about 1 KB each)
SHOWN_CHARS = 64  # of a claim's value in an error message


@dataclass(frozen=True, slots=True)
class Bearer:
    """Who a checked token says the caller is."""

    teams: tuple[str, ...]  # the team claim's names (one must be a team's)
    user: str | None  # the user claim's value
    kid: str | None  # the key that signed it
    expires: float  # its `exp`, in seconds since the epoch


def looks_like_jwt(secret: str) -> bool:
    """Whether a bearer secret is a JWT rather than an API key."""
    return secret.count(".") == 2 and not secret.startswith(KEY_PREFIX)


class Tokens:
    """Checks bearer tokens against one issuer and maps them to their team."""

    def __init__(self, keys: SigningKeys, settings: Settings) -> None:
        assert settings.oidc_issuer is not None
        self.keys = keys
        self._issuer, self._audience = settings.oidc_issuer, settings.oidc_audience
        self._algorithms = list(settings.algorithms)
        self._leeway_s = settings.oidc_leeway_s
        self._team_claim, self._user_claim = settings.oidc_team_claim, settings.oidc_user_claim
        self._checked: OrderedDict[str, Bearer] = OrderedDict()

    @classmethod
    def of(cls, settings: Settings, client: httpx.AsyncClient) -> Tokens | None:
        """The token checks `settings` ask for (None: no issuer, tokens are off)."""
        if settings.oidc_issuer is None:
            return None
        keys = SigningKeys(
            client,
            settings.oidc_issuer,
            settings.oidc_jwks_url,
            settings.algorithms,
            settings.oidc_jwks_ttl_s,
            settings.oidc_jwks_min_refetch_s,
            settings.oidc_fetch_timeout_s,
        )
        return cls(keys, settings)

    async def caller(self, token: str, snapshot: Snapshot) -> tuple[KeyView, str | None]:
        """The team a token's request is served as, and its end user; refused with a 401
        (`invalid_token`, `token_expired`) or a 403 (`team_not_found`)."""
        bearer = await self.check(token)
        return team_of(bearer, snapshot.team_callers, self._team_claim), bearer.user

    async def check(self, token: str) -> Bearer:
        """Who a valid token names; an invalid one is refused."""
        remembered = self._checked.get(token)
        if remembered is not None:
            if remembered.expires + self._leeway_s > time.time() and self.keys.holds(
                remembered.kid
            ):
                self._checked.move_to_end(token)
                return remembered
            del self._checked[token]
        kid = self._kid(token)
        claims = self._decode(token, await self.keys.find(kid))
        bearer = Bearer(
            _names(claims.get(self._team_claim)), self._user(claims), kid, float(claims["exp"])
        )
        self._checked[token] = bearer
        if len(self._checked) > REMEMBERED:
            self._checked.popitem(last=False)
        return bearer

    def _kid(self, token: str) -> str | None:
        """The key id in a token's header, once its algorithm is known to be accepted (so
        `none` and HS* are refused before anything else is done)."""
        try:
            header = jwt.get_unverified_header(token)
        except jwt.DecodeError:
            raise InvalidToken("The bearer token is not a well-formed JWT") from None
        algorithm, kid = header.get("alg"), header.get("kid")
        if algorithm not in self._algorithms:
            accepted = ", ".join(self._algorithms)
            raise InvalidToken(
                f"The token's algorithm `{str(algorithm)[:16]}` is not accepted ({accepted} are)"
            )
        if kid is not None and not isinstance(kid, str):
            raise InvalidToken("The token's key id (`kid`) is not a string")
        return kid

    def _decode(self, token: str, key: PyJWK) -> dict[str, Any]:
        """The token's claims, its signature and registered claims checked."""
        try:
            claims: dict[str, Any] = jwt.decode(
                token,
                key,
                algorithms=self._algorithms,
                audience=self._audience,
                issuer=self._issuer,
                leeway=self._leeway_s,
                options={"require": ["exp", "iss", "aud"]},
            )
        except jwt.PyJWTError as exc:
            raise refusal(exc) from None
        return claims

    def _user(self, claims: Mapping[str, Any]) -> str | None:
        user = claims.get(self._user_claim)
        if not isinstance(user, str) or not user:
            return None
        if len(user) > END_USER_CHARS:
            raise InvalidToken(
                f"The token's `{self._user_claim}` claim is over {END_USER_CHARS} characters"
            )
        return user


def refusal(exc: jwt.PyJWTError) -> InvalidToken:
    """The 401 for a token PyJWT refused, saying which check it failed."""
    if isinstance(exc, jwt.ExpiredSignatureError):
        return TokenExpired("The token has expired; get a new one from the issuer")
    messages: tuple[tuple[type[jwt.PyJWTError], str], ...] = (
        (jwt.ImmatureSignatureError, "The token is not valid yet (`nbf` or `iat` is ahead)"),
        (jwt.InvalidAudienceError, "The token's audience (`aud`) is not this gateway"),
        (jwt.InvalidIssuerError, "The token's issuer (`iss`) is not the one configured"),
        (jwt.InvalidSignatureError, "The token's signature does not verify"),
        (jwt.InvalidAlgorithmError, "The token's algorithm does not match its key's"),
        (jwt.MissingRequiredClaimError, f"The token lacks a required claim: {exc}"),
    )
    for kind, message in messages:
        if isinstance(exc, kind):
            return InvalidToken(message)
    return InvalidToken("The bearer token is not a valid JWT")


def _names(claim: object) -> tuple[str, ...]:
    """The team names a team claim holds: a string, or a list of strings (`groups`)."""
    if isinstance(claim, str):
        return (claim,)
    if isinstance(claim, list):
        return tuple(name for name in claim if isinstance(name, str))
    return ()


def team_of(bearer: Bearer, teams: Mapping[str, KeyView], claim: str) -> KeyView:
    """The one team a token's team claim names; none or several are a 403."""
    found = [teams[name] for name in dict.fromkeys(bearer.teams) if name in teams]
    if len(found) == 1:
        return found[0]
    if found:
        names = ", ".join(f"`{t.name}`" for t in found[:4])
        raise TeamNotFound(f"The token's `{claim}` claim names more than one team: {names}")
    if not bearer.teams:
        raise TeamNotFound(f"The token has no `{claim}` claim naming its team")
    shown = ", ".join(f"`{n[:SHOWN_CHARS]}`" for n in bearer.teams[:4])
    raise TeamNotFound(f"The token's `{claim}` claim names no team of this gateway: {shown}")
