"""The ``ragspec`` command: index documents, ask questions, chat, serve the web app (the benchmark is
``python benchmarks/bench.py``, a script of the repository).

Exit codes: 0 success, 1 a runtime error (one ``ragspec: error: ...`` line on stderr), 2 a usage
error, 130 interrupted. Set ``RAGSPEC_DEBUG=1`` to see the traceback of an unexpected error.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO, TypeVar

from ragspec.engine.config import DEFAULT_MAX_TOKENS

if TYPE_CHECKING:
    from apps.collection import Collection
    from ragspec.engine.results import GenerationStats
    from ragspec.answers import Answer
    from ragspec.remote import RemoteModel
    from retrievers.ingest import SyncProgress

PROG = "ragspec"
DEFAULT_INDEX = "ragspec-index"
DEFAULT_MAX_FILE_MB = 100.0
"""``retrievers.loaders.DEFAULT_MAX_FILE_BYTES`` in MiB (not imported here, so ``--help`` stays instant)."""


class CLIError(Exception):
    """A runtime error reported as one line, exit code 1."""


_N = TypeVar("_N", int, float)


def _number(convert: Callable[[str], _N], valid: Callable[[_N], bool], kind: str, bound: str) -> Callable[[str], _N]:
    """An argparse ``type``: the value converted ("expected {kind}" if it does not convert) and
    checked ("expected {bound}" if it is out of range)."""

    def parse(value: str) -> _N:
        try:
            x = convert(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {kind}, got {value!r}") from None
        if not valid(x):
            raise argparse.ArgumentTypeError(f"expected {bound}, got {value!r}")
        return x

    return parse


_positive = _number(int, lambda n: n >= 1, "a positive integer", "a positive integer")
_non_negative = _number(int, lambda n: n >= 0, "an integer >= 0", "an integer >= 0")
_mebibytes = _number(float, lambda x: 0 < x < float("inf") and x * 2**20 >= 1, "a size in MiB", "a positive size in MiB")
_seconds = _number(float, lambda x: x > 0, "a number of seconds", "a positive number of seconds")


def _port(value: str) -> int:
    n = _positive(value)
    if n > 65535:
        raise argparse.ArgumentTypeError(f"a port is at most 65535, got {value!r}")
    return n


def _generator_options(p: argparse.ArgumentParser) -> None:
    """Generation on an OpenAI-compatible server instead of the local model (docs/serving.md)."""
    g = p.add_argument_group("remote generation (an OpenAI-compatible server: vLLM, llama.cpp, Ollama, ragspec serve)")
    g.add_argument("--generator-url", metavar="URL",
                   help="generate on this server, e.g. http://gpu-box:8000/v1; retrieval, prompts and citations stay here")
    g.add_argument("--generator-model", metavar="NAME",
                   help="the server's name for the model (default: the first one GET /v1/models lists)")
    g.add_argument("--generator-tokenizer", metavar="NAME",
                   help="the served model's tokenizer, which builds the prompt here: a Hugging Face id, a folder or a "
                        ".gguf file (default: the model name; 'default' is ragspec's embedded model)")
    g.add_argument("--generator-prompt", choices=("tokens", "text"), default="tokens",
                   help="send the prompt as token ids (exact; vLLM, ragspec) or as text (servers that take text only, "
                        "e.g. Ollama) (default: tokens)")
    g.add_argument("--generator-context", metavar="TOKENS", type=_positive,
                   help="the served model's context window as the server runs it (e.g. llama.cpp's -c, Ollama's "
                        "num_ctx); passages that do not fit are dropped here (default: what the server lists, else "
                        "the tokenizer's limit)")
    g.add_argument("--generator-api-key", metavar="KEY",
                   help="the server's API key (default: the RAGSPEC_GENERATOR_API_KEY environment variable, which "
                        "other local users cannot see in the process list)")


class _CommandParser(argparse.ArgumentParser):
    """A command's parser: an option it does not know is its own usage error ("usage: ragspec ask ..."),
    naming the option, rather than the top-level usage after the next word was taken as an argument."""

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> tuple[argparse.Namespace, list[str]]:  # type: ignore[override]
        namespace, extras = super().parse_known_args(args, namespace)
        if extras:
            unknown = [a for a in extras if a.startswith("-")] or extras
            self.error(f"unrecognized arguments: {' '.join(unknown)} (see '{self.prog} --help')")
        return namespace, extras


def _embeddings_options(p: argparse.ArgumentParser) -> None:
    """Embeddings from a serving engine instead of the bundled model in this process."""
    g = p.add_argument_group("remote embeddings (an OpenAI-compatible /v1/embeddings: ragspec serve, vLLM, ...)")
    g.add_argument("--embeddings-url", metavar="URL",
                   help="embed passages and questions on this server, e.g. http://gpu-box:8000/v1; the index records "
                        "the model's name and refuses another")
    g.add_argument("--embeddings-model", metavar="NAME", help="the server's name for the embedding model (required with --embeddings-url)")
    g.add_argument("--embeddings-api-key", metavar="KEY",
                   help="the server's API key (default: the RAGSPEC_EMBEDDINGS_API_KEY environment variable)")


def _embeddings(args: argparse.Namespace) -> Any:
    """The ``--embeddings-*`` options as ``RemoteEmbeddings``; None without ``--embeddings-url``."""
    if not args.embeddings_url:
        for flag in ("embeddings_model", "embeddings_api_key"):
            if getattr(args, flag):
                raise CLIError(f"--{flag.replace('_', '-')} needs --embeddings-url")
        return None
    if not args.embeddings_model:
        raise CLIError("--embeddings-url needs --embeddings-model NAME (the server's name for the model)")
    from retrievers.remote_embeddings import RemoteEmbeddings

    try:
        return RemoteEmbeddings(args.embeddings_url, args.embeddings_model, api_key=args.embeddings_api_key)
    except ValueError as e:
        raise CLIError(str(e)) from e


def _store_options(p: argparse.ArgumentParser) -> None:
    """``--store`` and ``--collection``: the documents in PostgreSQL instead of an index folder (docs/scale-out.md)."""
    p.add_argument("--store", metavar="URL", default=None,
                   help="a PostgreSQL database with pgvector (postgresql://user@host/db) instead of an index folder: "
                        "dense and keyword search run inside it, so app replicas share it (pip install 'ragspec[postgres]'); "
                        "a folder here means the same as --index")
    p.add_argument("--collection", metavar="NAME", default=None,
                   help="with --store URL: which set of documents in the database (default: 'default')")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Document Q&A on a local model, sped up by lossless speculative decoding.",
        epilog="Run 'ragspec COMMAND --help' for a command's options.",
    )
    from ragspec import __version__

    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True, parser_class=_CommandParser)

    ingest = commands.add_parser("ingest", help="index files and folders into a persistent index (incremental)",
                                 description="Load, chunk and embed files and folders into an index on disk. Run it again "
                                             "on an existing index to update it: only new and changed files are read and "
                                             "embedded, passages of deleted files are removed, identical passages are "
                                             "stored once. The index is replaced atomically (Ctrl-C leaves the old one).")
    ingest.add_argument("paths", nargs="+", metavar="PATH", help="files or folders (.txt .md .html .pdf .docx .pptx .xlsx .csv .epub .odt .ipynb)")
    ingest.add_argument("-i", "--index", default=DEFAULT_INDEX, help=f"index folder to write (default: {DEFAULT_INDEX})")
    ingest.add_argument("--include", action="append", metavar="GLOB", help="only files matching GLOB in folders (repeatable)")
    ingest.add_argument("--exclude", action="append", metavar="GLOB", help="leave out files or folders matching GLOB (repeatable)")
    ingest.add_argument("--chunk-size", type=_positive, default=256, help="chunk size in tokens (default: 256)")
    ingest.add_argument("--chunk-overlap", type=int, default=None,
                        help="tokens shared by consecutive chunks (default: 32, or a quarter of a chunk of 32 tokens or less)")
    ingest.add_argument("--max-file-mb", type=_mebibytes, default=DEFAULT_MAX_FILE_MB, metavar="MB",
                        help=f"skip files larger than this many MiB, each with its reason (default: {DEFAULT_MAX_FILE_MB:g})")
    ingest.add_argument("--no-progress", action="store_true", help="no progress bar")
    _store_options(ingest)
    _embeddings_options(ingest)

    def answer_options(p: argparse.ArgumentParser) -> None:
        p.add_argument("-i", "--index", default=DEFAULT_INDEX, help=f"index folder made by 'ragspec ingest' (default: {DEFAULT_INDEX})")
        p.add_argument("--max-tokens", type=_positive, default=DEFAULT_MAX_TOKENS,
                       help=f"most tokens per answer (default: {DEFAULT_MAX_TOKENS})")
        p.add_argument("-k", "--passages", type=_positive, default=4, dest="k", help="passages retrieved per question (default: 4)")
        _store_options(p)
        _embeddings_options(p)
        g = p.add_argument_group("penalties (over the answer's own tokens: quoting the passages is not punished)")
        for flag, kind, help_ in PENALTY_FLAGS:
            g.add_argument(flag, type=kind, default=None, metavar="N" if kind is int else "X", help=help_)
        _local_model_options(p)
        _generator_options(p)

    ask = commands.add_parser("ask", help="answer one question, streamed, with citations and speed",
                              description="Answer a question from an index: the answer streams, then its citations and speed.")
    ask.add_argument("question", help="the question (quote it)")
    answer_options(ask)
    ask.add_argument("--no-stats", action="store_true", help="do not print the speed line")

    chat = commands.add_parser("chat", help="interactive questions that keep the conversation",
                               description="Ask questions one after another; the conversation is kept. "
                                           "Type /reset to forget it, /exit (or Ctrl-D) to leave.")
    answer_options(chat)

    serve = commands.add_parser("serve", help="run the web app and the OpenAI-compatible API",
                                description="Serve the document Q&A web page (upload files, ask, see cited, streamed answers) "
                                            "and an OpenAI-compatible API under /v1 (chat and text completions) over the "
                                            "same model. See docs/serving.md.")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1, this machine only)")
    serve.add_argument("--port", type=_port, default=8000, help="port (default: 8000)")
    serve.add_argument("-i", "--index", default=None, help="an index every session can ask before uploading its own")
    _store_options(serve)
    _embeddings_options(serve)
    serve.add_argument("--max-tokens", type=_positive, default=DEFAULT_MAX_TOKENS,
                       help=f"most tokens per answer (default: {DEFAULT_MAX_TOKENS})")
    serve.add_argument("--max-upload-mb", type=_positive, default=10, help="largest uploaded file in MiB (default: 10)")
    serve.add_argument("--allow-folders", action=argparse.BooleanOptionalAction, default=None,
                       help="let the page index folders on the server (default: only when bound to loopback)")
    serve.add_argument("--api-key", default=None, metavar="KEY",
                       help="require 'Authorization: Bearer KEY' on every /api and /v1 request; needed to bind a non-loopback "
                            "address (default: the RAGSPEC_API_KEY environment variable, which other local users "
                            "cannot see in the process list)")
    serve.add_argument("--trusted-host", action="append", default=[], metavar="NAME",
                       help="also answer requests whose Host is NAME, e.g. the name a reverse proxy forwards "
                            "(repeatable; default: localhost names and the bound address)")
    serve.add_argument("--shared-prefix-cache", action="store_true",
                       help="let every web session and /v1 client reuse each other's cached prompt prefixes (faster, "
                            "but a user can then probe another's prompts); default: each session, and each /v1 "
                            "cache_salt, has its own (docs/threat-model.md)")
    serve.add_argument("--max-queue", type=_non_negative, default=16, metavar="N",
                       help="requests that may wait for the model (web questions and /v1 calls together); "
                            "more get a 429 with Retry-After (default: 16)")
    serve.add_argument("--queue-timeout", type=_seconds, default=120.0, metavar="SECONDS",
                       help="longest wait in the queue before a request gets a 'busy' error (default: 120)")
    serve.add_argument("--concurrency", type=_positive, default=None, metavar="N",
                       help="answers generated at once: 1 with the local model; with --generator-url the server may "
                            "batch them (default: 4 there)")
    _local_model_options(serve)
    serve.add_argument("--engine", choices=("ragspec", "vllm"), default="ragspec",
                       help="what generates: ragspec's own engine (default), or a vLLM server started and supervised "
                            "here on 127.0.0.1 with ragspec's drafting inside it, serving --model (a folder, a .gguf "
                            "file or 'default'); vLLM's own flags go after '--' (docs/scale-out.md)")
    serve.add_argument("--vllm-draft-tokens", type=_non_negative, default=None, metavar="K",
                       help="with --engine vllm: longest draft ragspec's proposer hands vLLM (0: no speculation; "
                            "default: 8)")
    serve.add_argument("--draft-model", default=None, metavar="DIR",
                       help="with --engine vllm: a smaller model of the same tokenizer (a folder, 'default' or 'weak', "
                            "the default model cut to 2 layers) that vLLM runs beside --model; ragspec's hybrid then "
                            "drafts per request from the passages where they match and from this model elsewhere "
                            "(docs/scale-out.md)")
    _generator_options(serve)

    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    engine_args: list[str] = []
    if args_list and args_list[0] == "serve" and "--" in args_list:  # vLLM's own flags follow '--'
        split = args_list.index("--")
        args_list, engine_args = args_list[:split], args_list[split + 1 :]
    parser = build_parser()
    try:
        args = parser.parse_args(args_list)
    except SystemExit as e:  # argparse: 0 for --help/--version, 2 for usage errors
        return int(e.code) if isinstance(e.code, int) else 2
    args.engine_args = engine_args
    handler = {"ingest": _ingest, "ask": _ask, "chat": _chat, "serve": _serve}[args.command]
    return _guard(lambda: handler(args))


def _guard(run: Any) -> int:
    """Run a command; turn errors into one line and an exit code."""
    try:
        return int(run() or 0)
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except Exception as e:  # noqa: BLE001 - every failure becomes one clear line
        if os.environ.get("RAGSPEC_DEBUG"):
            raise
        print(_error_line(e), file=sys.stderr)
        return 1


def _error_line(e: Exception) -> str:
    """``ragspec: error: ...``: the first line of the message, with the type where it helps."""
    message = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    known = isinstance(e, CLIError) or type(e).__module__.split(".")[0] in ("apps", "retrievers", "ragspec")
    prefix = "" if known or isinstance(e, (OSError, ValueError)) else f"{type(e).__name__}: "
    return f"{PROG}: error: {prefix}{message}"


_SURROGATES = re.compile("[\ud800-\udfff]")


def _clean_text(text: str) -> str:
    """Text that encodes as UTF-8: each byte that was not UTF-8 (Python keeps it in argv and stdin
    as a surrogate escape) and each lone surrogate becomes U+FFFD."""
    return _SURROGATES.sub("\ufffd", text)


# -- commands ------------------------------------------------------------------------------------


def _target(args: argparse.Namespace, default: str | None = DEFAULT_INDEX) -> tuple[str | None, str | None]:
    """(index folder or database URL, collection) from ``--index``, ``--store`` and ``--collection``."""
    from retrievers.store_url import is_database_url

    index = args.index if args.index != DEFAULT_INDEX or default is None else None
    if args.store is not None and index is not None:
        raise CLIError("--store and --index both name where the documents are: give one")
    target = args.store if args.store is not None else (args.index if args.index is not None else default)
    if args.collection is not None:
        if not is_database_url(target):
            raise CLIError("--collection names a set of documents in a database: it needs --store postgresql://...")
        if not args.collection.strip():
            raise CLIError("--collection is empty")
    return target, args.collection


def _require_extras(command: str, target: str | None) -> None:
    """The extras a command over documents needs (``retrieval``; ``postgres`` for a database), checked
    before anything loads: a missing one is a ``MissingExtraError`` naming it."""
    from retrievers.extras import require
    from retrievers.store_url import is_database_url

    require("retrieval", f"ragspec {command}")
    if target is not None and is_database_url(target):
        require("postgres", f"ragspec {command} --store")


def _where(target: str, collection: str | None) -> str:
    from retrievers.store_url import safe_label

    return safe_label(target, collection)


def _chunk_overlap(chunk_size: int, overlap: int | None) -> int:
    """``--chunk-overlap``, or its default: 32 tokens, a quarter of chunks too small for that."""
    if overlap is None:
        return 32 if chunk_size > 32 else chunk_size // 4
    if not 0 <= overlap < chunk_size:
        raise CLIError(f"--chunk-overlap must be at least 0 and less than --chunk-size ({chunk_size}), got {overlap}")
    return overlap


def _ingest(args: argparse.Namespace) -> int:
    target, collection = _target(args)
    assert target is not None
    _require_extras("ingest", target)
    from apps.collection import update_index
    from retrievers import check_index_writable
    from retrievers.store_url import is_database_url

    if not is_database_url(target):
        check_index_writable(target)  # fail now, not after embedding everything
    bar = _ProgressBar(enabled=not args.no_progress)
    try:
        summary = update_index(
            args.paths,
            target,
            collection=collection,
            embeddings=_embeddings(args),
            include=args.include,
            exclude=args.exclude,
            chunk_size=args.chunk_size,
            chunk_overlap=_chunk_overlap(args.chunk_size, args.chunk_overlap),
            max_file_bytes=int(args.max_file_mb * 2**20),
            progress=bar.update,
        )
    finally:
        bar.close()
    report = summary.update
    assert report is not None
    if report.rebuilt:
        print(f"Rebuilt the whole index: {report.rebuilt}.")
    print(f"Files: {report.files_line()}")
    again = f" ({report.reembedded} of them again: their first source changed)" if report.reembedded else ""
    passages = [
        (report.embedded, f"embedded{again}"),
        (report.reused, "already indexed"),
        (report.duplicates, "repeats stored once"),
        (report.removed_chunks, "removed"),
    ]
    print("Passages: " + (", ".join(f"{n} {what}" for n, what in passages if n) or "none embedded"))
    if report.saved:
        print(f"Indexed {report.passages} passages from {report.files} file(s) into {_where(target, collection)} in {report.seconds:.1f} s")
    else:
        print(f"Nothing changed: {_where(target, collection)} holds {report.passages} passages from {report.files} file(s), left as it was "
              f"({report.seconds:.1f} s)")
    if summary.skipped:
        print(f"Skipped {len(summary.skipped)} file(s):")
        for s in summary.skipped:
            print(f"  {s.path}: {s.reason}")
    return 0


class _ProgressBar:
    """One tqdm bar per stage of ``update_index``, on stderr: files checked, bytes read (with files and
    passages found), passages embedded (with their rate and the time left)."""

    _LABELS = {"scan": "checking", "chunk": "reading", "embed": "embedding", "save": "saving"}

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._bar: Any = None
        self._stage = ""

    def update(self, p: SyncProgress) -> None:
        if p.stage != self._stage:
            self.close()
            self._stage = p.stage
            if p.stage == "embed":
                _quiet_model_loading()  # the model loads now, and only if there is something to embed
            if self.enabled and p.stage != "save" and (p.files_total or p.chunks_total):  # no bar for nothing to do
                self._bar = self._new_bar(p)
        if self._bar is None:
            return
        if p.stage == "scan":
            self._bar.update(p.files_done - self._bar.n)
        elif p.stage == "chunk":
            self._bar.set_postfix_str(f"files {p.files_done}/{p.files_total}, {p.chunks_done:,} passages", refresh=False)
            self._bar.update(p.bytes_done - self._bar.n)
        else:
            self._bar.update(p.chunks_done - self._bar.n)

    def _new_bar(self, p: SyncProgress) -> Any:
        from tqdm import tqdm

        label = self._LABELS.get(p.stage, p.stage)
        if p.stage == "scan":
            return tqdm(total=p.files_total, desc=label, unit="file", file=sys.stderr, leave=True)
        if p.stage == "chunk":
            return tqdm(total=p.bytes_total, desc=label, unit="B", unit_scale=True, unit_divisor=1024, file=sys.stderr, leave=True)
        return tqdm(total=p.chunks_total, desc=label, unit="passage", file=sys.stderr, leave=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def _quiet_model_loading() -> None:
    """No per-tensor progress bars from transformers between the answer's lines."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


PENALTY_FLAGS = (
    ("--frequency-penalty", float, "lower a token once per time it occurs in the answer (-2 to 2, as OpenAI)"),
    ("--presence-penalty", float, "lower a token once it occurs in the answer (-2 to 2, as OpenAI)"),
    ("--repeat-penalty", float, "divide the logit of a token among the last --repeat-last-n answer tokens (llama.cpp; 1: off)"),
    ("--repeat-last-n", int, "answer tokens --repeat-penalty looks at (default: 64; -1: all)"),
)


def _penalties(args: argparse.Namespace) -> dict[str, Any]:
    """The penalty flags given, as ``GenerationConfig`` options; a bad value is a ``CLIError`` naming its flag."""
    from ragspec.engine.config import GenerationConfig, GenerationConfigError

    options = {}
    for flag, _, _ in PENALTY_FLAGS:
        name = flag[2:].replace("-", "_")
        if getattr(args, name, None) is not None:
            options[name] = getattr(args, name)
            try:
                GenerationConfig(**{name: options[name]})
            except GenerationConfigError as e:
                raise CLIError(e.named(flag)) from e
    return options


def _collection(args: argparse.Namespace) -> Collection:
    from apps.collection import Collection
    from retrievers.store_url import is_database_url

    target, collection = _target(args)
    assert target is not None
    _require_extras(args.command, target)
    if not is_database_url(target) and not Path(target).is_dir():
        raise CLIError(f"no index at {target}: build one with 'ragspec ingest PATH... --index {target}'")
    options = _penalties(args)
    _quiet_model_loading()
    qa = Collection(target, max_tokens=args.max_tokens, k=args.k, model=args.model, source=_remote(args),
                    backend=args.backend, options=options, collection=collection, embeddings=_embeddings(args))
    if is_database_url(target):
        qa.load()  # reach the database now: a wrong URL or collection fails before the model loads
    return qa


def _local_model_options(p: argparse.ArgumentParser) -> None:
    from ragspec.backends import BACKENDS

    p.add_argument("--model", default="default", help="generator: 'default' (SmolLM2-135M-Instruct), a local folder or a .gguf file")
    p.add_argument("--backend", choices=BACKENDS, default="auto",
                   help="what runs the local model: llama.cpp (GGUF files; pip install 'ragspec[llamacpp]') or PyTorch "
                        "(default: auto, llama.cpp for GGUF files of 1B parameters or more when it is installed; "
                        "docs/backends.md)")


def _remote(args: argparse.Namespace) -> RemoteModel | None:
    """The ``--generator-*`` options as a ``RemoteModel``; None without ``--generator-url``."""
    if not args.generator_url:
        for flag in ("generator_model", "generator_tokenizer", "generator_api_key", "generator_context"):
            if getattr(args, flag):
                raise CLIError(f"--{flag.replace('_', '-')} needs --generator-url")
        if args.generator_prompt != "tokens":
            raise CLIError("--generator-prompt needs --generator-url")
        return None
    if getattr(args, "model", "default") != "default":
        raise CLIError("--model picks a local generator; with --generator-url name the served model with --generator-model")
    if getattr(args, "backend", "auto") != "auto":
        raise CLIError("--backend picks what runs a local generator; with --generator-url the server runs the model")
    from ragspec.engine.config import GenerationConfig
    from ragspec.remote import RemoteModel

    return RemoteModel(
        args.generator_url,
        model=args.generator_model or "",
        api_key=args.generator_api_key,  # None: RemoteModel reads RAGSPEC_GENERATOR_API_KEY
        tokenizer=args.generator_tokenizer,
        context_length=args.generator_context,
        prompt_format=args.generator_prompt,
        config=GenerationConfig(max_tokens=args.max_tokens),
    )


def _print_answer(collection: Collection, question: str, history: list[tuple[str, str]], out: TextIO, stats: bool = True) -> Answer:
    from apps.collection import Token

    finished: Answer | None = None
    for event in collection.stream(question, history):
        if isinstance(event, Token):
            out.write(event.text)
            out.flush()
        else:
            finished = event
    assert finished is not None
    out.write("\n")
    if finished.citations:
        out.write("\nSources:\n")
        for c in finished.citations:
            where = " · ".join(x for x in (c.title, c.location) if x)
            out.write(f"  [{c.number}] {c.source}" + (f" ({where})" if where else "") + "\n")
    if not finished.supported:
        out.write(f"\n{finished.note} Check it against your documents.\n")
    if stats:
        out.write(f"\n{_speed_line(finished.stats)}\n")
    out.flush()
    return finished


def _speed_line(s: GenerationStats) -> str:
    """The answer's speed, with the drafting figures the engine counted (``GenerationStats.reported``)."""
    shown = s.reported()
    parts = [f"{s.new_tokens} tokens in {s.wall_s:.1f} s", f"{s.decode_tokens_per_s:.1f} tokens/s"]
    if "acceptance_rate" in shown:
        parts.append(f"acceptance {s.acceptance_rate:.0%}")
    if "tokens_per_forward" in shown:
        parts.append(f"{s.tokens_per_forward:.2f} tokens/forward")
    return " · ".join(parts)


def _ask(args: argparse.Namespace) -> int:
    question = _clean_text(args.question)
    if not question.strip():
        raise CLIError("the question is empty")
    _print_answer(_collection(args), question, [], sys.stdout, stats=not args.no_stats)
    return 0


def _chat(args: argparse.Namespace) -> int:
    collection = _collection(args)
    history: list[tuple[str, str]] = []
    failed = 0  # questions that got an error instead of an answer: the exit status says so
    interactive = sys.stdin.isatty()
    reconfigure = getattr(sys.stdin, "reconfigure", None)
    if reconfigure is not None:
        reconfigure(errors="replace")  # a line that is not UTF-8 is asked with U+FFFD, not fatal
    if interactive:
        print("Ask about your documents. /reset forgets the conversation, /exit leaves.")
    while True:
        try:
            line = input("you> " if interactive else "")
        except EOFError:
            if interactive:
                print()
            return 1 if failed else 0
        question = _clean_text(line).strip()
        if not question:
            continue
        if question in ("/exit", "/quit"):
            return 1 if failed else 0
        if question == "/reset":
            history.clear()
            print("(conversation cleared)")
            continue
        if not interactive:
            print(f"you> {question}")
        sys.stdout.write("ragspec> ")
        try:
            finished = _print_answer(collection, question, history, sys.stdout)
        except Exception as e:  # noqa: BLE001 - one question failed: say so, keep the session
            print(flush=True)
            if os.environ.get("RAGSPEC_DEBUG"):
                traceback.print_exc()
            print(_error_line(e), file=sys.stderr, flush=True)
            failed += 1
            continue
        history.append((question, finished.text))
        print()


def _serve(args: argparse.Namespace) -> int:
    from retrievers.extras import require

    require("server", "ragspec serve")
    from apps.web.security import require_key_off_loopback
    from apps.web.server import AppConfig, is_loopback, serve, trusted_hosts_for

    api_key = args.api_key if args.api_key is not None else os.environ.get("RAGSPEC_API_KEY") or None
    require_key_off_loopback(args.host, api_key)
    allow_folders = is_loopback(args.host) if args.allow_folders is None else args.allow_folders
    remote = _remote(args) if args.engine == "ragspec" else None
    if args.concurrency is not None and args.concurrency > 1 and remote is None and args.engine == "ragspec":
        raise CLIError("--concurrency above 1 needs --generator-url: the local model decodes one answer at a time")
    config = AppConfig(
        max_file_bytes=args.max_upload_mb * 2**20,
        max_tokens=args.max_tokens,
        allow_folders=allow_folders,
        trusted_hosts=trusted_hosts_for(args.host, args.trusted_host),
        api_key=api_key,
        max_queue=args.max_queue,
        queue_timeout_s=args.queue_timeout,
        concurrency=args.concurrency or (4 if remote is not None else 8 if args.engine == "vllm" else 1),
        shared_prefix_cache=args.shared_prefix_cache,
    )
    if allow_folders and not is_loopback(args.host):
        print(f"{PROG}: warning: --allow-folders on {args.host}: anyone with the API key can index server folders", file=sys.stderr)
    if args.engine == "vllm":
        return _serve_on_vllm(args, config)
    if args.engine_args or args.vllm_draft_tokens is not None or args.draft_model is not None:
        raise CLIError("vLLM flags after '--', --vllm-draft-tokens and --draft-model need --engine vllm")
    preload = _preload(args, remote, model=args.model, backend=args.backend)
    _quiet_model_loading()
    locked = " (API key required)" if api_key else ""
    url = f"http://{args.host}:{args.port}"
    if remote is not None:
        from dataclasses import replace

        name = remote.load().model_name  # reaches the server now, not at the first question
        remote = replace(remote, model=name)
        print(f"generating on {remote.base_url} (model {name!r})", file=sys.stderr)
    print(f"ragspec web app on {url}/ and OpenAI-compatible API on {url}/v1{locked} (Ctrl-C to stop)", file=sys.stderr)
    _say_where_state_lives(args)
    if remote is not None:
        serve(args.host, args.port, config=config, preload=preload, generation=remote, state_url=_state_url(args))
    else:  # the local model, loaded before listening
        from ragspec.registry import LocalModel

        serve(args.host, args.port, config=config, preload=preload, generation=LocalModel(model=args.model, backend=args.backend),
              state_url=_state_url(args))
    return 0


def _say_where_state_lives(args: argparse.Namespace) -> None:
    if _state_url(args) is not None:
        print("sessions, conversations and uploads are kept in the database: "
              "other 'ragspec serve --store' replicas over it serve the same users", file=sys.stderr)  # fmt: skip


def _state_url(args: argparse.Namespace) -> str | None:
    """With ``--store postgresql://...``: the database the app keeps its sessions, conversations and uploads in
    (so that replicas over it are interchangeable, docs/scale-out.md); else None (this process)."""
    from retrievers.store_url import is_database_url

    return args.store if is_database_url(args.store) else None


def _preload(args: argparse.Namespace, remote: Any, **local: str) -> Collection | None:
    """The ``--index`` folder or ``--store`` collection every session can ask; None without either."""
    from apps.collection import Collection
    from retrievers.store_url import is_database_url

    target, collection = _target(args, default=None)
    if target is None:
        if args.embeddings_url:
            raise CLIError("--embeddings-url embeds for --index or --store; give one of them")
        return None
    _require_extras("serve", target)
    if not is_database_url(target) and not Path(target).is_dir():
        raise CLIError(f"no index at {target}: build one with 'ragspec ingest PATH... --index {target}'")
    preload = Collection(target, max_tokens=args.max_tokens, source=remote, collection=collection,
                         embeddings=_embeddings(args), **local)
    if is_database_url(target):
        preload.load()  # reach the database now, not at the first question
    return preload


def _serve_on_vllm(args: argparse.Namespace, config: Any) -> int:
    """``serve --engine vllm``: start vLLM with ragspec's proposer, serve the app on it, stop it on exit.

    If vLLM exits while the app serves, the app stops too and the command fails with vLLM's status.
    """
    import _thread
    from dataclasses import replace

    from apps.web.server import serve
    from ragspec.engine.config import GenerationConfig
    from ragspec.backends.models import model_label
    from ragspec.backends.pytorch.loading import model_folder
    from ragspec.backends.vllm.server import DEFAULT_DRAFT_TOKENS, VllmServer, speculative_config
    from ragspec.remote import RemoteModel

    if args.generator_url:
        raise CLIError("--engine vllm starts its own vLLM server; --generator-url names one started elsewhere: use one of them")
    if args.backend != "auto":
        raise CLIError("--backend picks what runs the local model; with --engine vllm, vLLM runs it")
    draft_tokens = DEFAULT_DRAFT_TOKENS if args.vllm_draft_tokens is None else args.vllm_draft_tokens
    folder = model_folder(args.model)
    label = model_label(args.model)  # the model's own name, as ragspec's engine gives it
    if args.draft_model is not None and not draft_tokens:
        raise CLIError("--draft-model drafts: it needs --vllm-draft-tokens above 0")
    if args.draft_model is not None:  # the hybrid: n-gram drafts and the draft model's
        from ragspec.backends.vllm.draft import draft_folder
        from ragspec.backends.vllm.server import check_draft_folder, hybrid_config

        draft = draft_folder(args.draft_model)
        check_draft_folder(folder, draft)
        speculation, drafting = hybrid_config(draft, draft_tokens), f"ragspec's hybrid with draft model {draft}"
    else:
        speculation, drafting = speculative_config(draft_tokens) if draft_tokens else None, "ragspec's proposer"
    server = VllmServer(folder, speculation=speculation, hybrid=args.draft_model is not None,
                        extra_args=args.engine_args, served_name=label)
    print(f"{PROG}: starting vLLM on {folder} (the first start compiles for a few minutes)", file=sys.stderr)
    server.start()
    vllm_exit: list[int] = []
    stopping = threading.Event()

    def watch() -> None:  # supervision: the app does not outlive its generator
        assert server.process is not None
        status = server.process.wait()
        if not stopping.is_set():
            vllm_exit.append(status)
            _thread.interrupt_main()  # uvicorn takes it as Ctrl-C and shuts down

    def terminated(signum: int, frame: object) -> None:  # uvicorn re-raises SIGTERM once it has shut down
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, terminated)  # so that vLLM is stopped below, not orphaned
    try:
        threading.Thread(target=watch, name="vllm-watch", daemon=True).start()
        remote = RemoteModel(server.base_url, model=label, tokenizer=str(folder),
                             config=GenerationConfig(max_tokens=args.max_tokens))
        config = replace(config, model_name=args.model)  # /v1 answers to --model as given, as without --engine
        preload = _preload(args, remote)
        _quiet_model_loading()
        url = f"http://{args.host}:{args.port}"
        locked = " (API key required)" if config.api_key else ""
        print(f"generating on vLLM at {server.base_url} ({drafting}, up to {draft_tokens} drafted tokens)", file=sys.stderr)
        print(f"ragspec web app on {url}/ and OpenAI-compatible API on {url}/v1{locked} (Ctrl-C to stop)", file=sys.stderr)
        _say_where_state_lives(args)
        try:
            serve(args.host, args.port, config=config, preload=preload, generation=remote, state_url=_state_url(args))
        except KeyboardInterrupt:
            if not vllm_exit:
                raise
        if vllm_exit:
            raise CLIError(f"vLLM exited with status {vllm_exit[0]} while serving: {server.log_tail()}")
        return 0
    finally:
        stopping.set()
        server.stop()
        signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
