"""The web app's limits and defaults (``AppConfig``), checked when built."""

from __future__ import annotations

from dataclasses import dataclass, field

from apps.web.openai_api import openai_error_body
from apps.web.security import LOCAL_HOSTS, SecurityPolicy
from ragspec.engine.config import DEFAULT_MAX_TOKENS, request_max_tokens

DEFAULT_SUFFIXES = (
    ".txt", ".md", ".markdown", ".html", ".htm", ".pdf", ".docx", ".pptx", ".xlsx", ".csv", ".epub", ".odt", ".ipynb"
)


@dataclass(frozen=True)
class AppConfig:
    """Limits and defaults of the web app; checked when it is built."""

    max_file_bytes: int = 10 * 2**20
    """Largest uploaded file (413 beyond)."""
    max_request_bytes: int = 50 * 2**20
    """Largest upload request (413 beyond, as soon as that much has arrived)."""
    max_body_bytes: int = 2**20
    """Largest body of any other request (413 beyond)."""
    max_session_bytes: int = 100 * 2**20
    """Most bytes of uploaded files one session keeps (413 beyond)."""
    max_files: int = 50
    allowed_suffixes: tuple[str, ...] = DEFAULT_SUFFIXES
    """File types accepted for upload (415 otherwise)."""
    max_sessions: int = 32
    """Most sessions at once; a new one beyond gets a 503 (none is evicted)."""
    session_ttl_s: float = 3600.0
    """A session idle this long is dropped with its files."""
    queue_timeout_s: float = 120.0
    """How long a question waits for the model before it gives up."""
    max_queue: int = 16
    """Most requests waiting for the model (web questions and ``/v1`` calls together); 429 beyond."""
    concurrency: int = 1
    """Answers generated at once: 1 for a local model; more only for a remote generator that batches."""
    answer_timeout_s: float = 300.0
    """Longest one answer may take; it is cut (and the model freed) after that."""
    max_tokens: int = DEFAULT_MAX_TOKENS
    max_question_chars: int = 2000
    allow_folders: bool = True
    """Allow ``POST /api/folder`` (reads any folder the server process can read)."""
    secure_cookie: bool = False
    trusted_hosts: tuple[str, ...] = LOCAL_HOSTS
    """Names accepted in the ``Host`` header; ``trusted_hosts_for(bind_address)`` makes the list."""
    api_key: str | None = field(default=None, repr=False)
    """When set, every ``/api/`` and ``/v1/`` request needs ``Authorization: Bearer KEY``."""
    model_name: str | None = None
    """The name ``/v1`` clients send as ``model`` (None: the generation source's ``model``); the
    model's own name is accepted too (``apps.web.openai_api.ApiSettings``)."""
    shared_prefix_cache: bool = False
    """Let every web session and ``/v1`` client reuse each other's prompt prefixes (one user, or users who
    may see each other's prompts); by default each session, and each ``/v1`` ``cache_salt``, has its own
    (``ragspec.engine.tenancy``, docs/threat-model.md)."""

    def __post_init__(self) -> None:
        names = (
            "max_file_bytes", "max_request_bytes", "max_body_bytes", "max_session_bytes", "max_files", "max_sessions",
            "max_question_chars", "concurrency",
        )  # fmt: skip
        request_max_tokens(self.max_tokens)
        for name in names:
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, got {self.max_queue}")
        for name in ("session_ttl_s", "queue_timeout_s", "answer_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if not self.allowed_suffixes or any(not s.startswith(".") for s in self.allowed_suffixes):
            raise ValueError(f"allowed_suffixes must be non-empty suffixes like '.md', got {self.allowed_suffixes!r}")
        self.security()  # checks trusted_hosts and api_key

    def security(self) -> SecurityPolicy:
        """The request checks this config asks for (uploads get their own body limit; ``/v1`` errors are OpenAI's)."""
        return SecurityPolicy(
            trusted_hosts=self.trusted_hosts,
            api_key=self.api_key,
            max_body_bytes=self.max_body_bytes,
            body_limits={"/api/documents": self.max_request_bytes, "/v1/": self.max_body_bytes},
            error_body=openai_error_body,
        )
