"""The llama.cpp back end: a GGUF file run by llama.cpp's quantized CPU kernels, under ragspec's drafting.

Driven through llama-cpp-python's low-level API (``ragspec[llamacpp]``, pinned), not its ``Llama``
class, whose ``eval`` keeps an ``n_ctx x n_vocab`` score array and copies every position's logits:

- A forward fills one preallocated ``llama_batch`` (token ids, positions, and a logits flag that
  is set only for the positions verification needs: the last prompt token after a prefill, every
  position of ``[pending, *draft]`` in a verify step) and calls ``llama_decode``. The logits come
  back as a zero-copy torch view of llama.cpp's output buffer (valid until the next decode).
  Prompts longer than ``n_batch`` are fed in chunks.
- Rollback: ``crop(-m)`` removes the last ``m`` positions of the sequence from the context's memory
  (``llama_memory_seq_rm``); the next decode writes the new tokens at those positions again.
- Prefix reuse: a finished request's sequence state is copied out of the context
  (``llama_state_seq_get_data``) into the generator's prefix cache (``ragspec.engine.prefix_cache``); a
  later prompt sharing a prefix with it gets it copied back (``llama_state_seq_set_data``) and
  cropped, or, when the context still holds it, just cropped.
- Weights are loaded once per file (``LlamaCppModel``, memory-mapped) and shared; each generator
  has its own context (``LlamaCppBackend``): its KV cache, threads and batch sizes.

Text <-> ids stays the Hugging Face tokenizer read from the GGUF file (chat template, stop strings
and streaming are shared with the PyTorch back end); loading checks that its vocabulary size equals
llama.cpp's, and the tests check that both tokenize the bundled prompts to the same ids.

Lossless relative to this back end: greedy output is token-identical to llama.cpp's own plain
greedy decoding of the same file with the same settings, threads included (bit for bit at the
defaults, on every core; with f16 keys and values on several threads only up to a divergence where
the plain step's two best logits are closer than llama.cpp's split one-token attention and a verify
batch's round apart, ``LlamaCppSettings``), sampled
output has its distribution. It is not identical to the PyTorch back end's output: that runs
de-quantized fp32 weights, this runs the quantized ones.
"""

from __future__ import annotations

import ctypes
import importlib.util
import logging
import os
import threading
import weakref
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from ragspec.backends.base import BackendUnavailableError
from ragspec.engine.cancel import check as check_cancelled
from ragspec.backends.models import gguf_tokenizer
from ragspec.engine.results import ModelLoadError
from retrievers.extras import MissingExtraError, needs

logger = logging.getLogger(__name__)

PINNED_VERSION = "0.3.36"
INSTALL_HINT = "pip install 'ragspec[llamacpp]'"
_BUILD_NOTE = "where pip finds no wheel it compiles llama.cpp, 15-35 min once; or use backend='torch'"
_GGUF_MAGIC = b"GGUF"
_NEEDED = ("llama_batch_init", "llama_decode", "llama_get_logits", "llama_get_memory", "llama_memory_seq_rm",
           "llama_memory_clear", "llama_model_load_from_file", "llama_init_from_model", "llama_vocab_n_tokens")


def available() -> bool:
    """True when llama-cpp-python is installed (it is not imported here)."""
    return importlib.util.find_spec("llama_cpp") is not None


def physical_cores() -> int:
    """Physical cores this process may run on (hyper-threads of one core count once)."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    cores = set()
    for cpu in cpus:
        topology = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            cores.add(((topology / "physical_package_id").read_text().strip(), (topology / "core_id").read_text().strip()))
        except OSError:  # no sysfs topology (not Linux, or hidden): every logical CPU counts
            return max(len(cpus), 1)
    return max(len(cores), 1)


_ROW_BY_ROW = frozenset({"Q4_1"})
"""Weight types whose verify batches llama.cpp multiplies row by row on x86 (no repacked or tinyBLAS
kernel): measured r(8) 2.5-3.8 plain steps on the default model (docs/backends.md)."""

_KV_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "iq4_nl": 20, "bf16": 30}
"""The KV cache types llama.cpp takes (``enum ggml_type`` in ggml.h; llama-cpp-python has no constant for bf16)."""


def kv_type_id(name: str) -> int:
    """llama.cpp's id of a KV cache type name (for llama-cpp-python's ``Llama(type_k=..., type_v=...)``)."""
    return _KV_TYPES[name]


_SPLIT_KV_TYPES = frozenset({"f32", "f16"})
"""Cache types for which llama.cpp's CPU flash attention splits a one-token step over the cached positions
(keys and values both f16; f32 ones are cast to f16 for flash attention first)."""

_TILE_ROWS = 64
"""ggml's flash-attention tile (``GGML_FA_TILE_Q``): batches of this many rows or more take the tiled kernel."""


@dataclass(frozen=True)
class LlamaCppSettings:
    """How llama.cpp runs a GGUF file: threads, batch sizes, attention kernel, context window.

    Exactness is defined against plain greedy decoding with the same settings (docs/backends.md,
    "Exactness"). llama.cpp's CPU attention rounds differently depending on how a position is
    evaluated, and its quantized products turn such rounding into logit differences far above
    ties, so the defaults make a drafted token verified in a batch see a one-token step's arithmetic:

    - ``flash_attn=True``: batches of fewer than 64 rows then compute each row exactly as a
      one-token step does (without flash attention the matrix products differ
      between one row and several);
    - verification batches stay under 64 rows (the back end splits longer ones) and prompts are
      evaluated in batches of at least 64 rows (the tiled kernel, where keys and values are both f16), also
      when a cached prefix is reused, so an answer does not depend on what the cache held before;
    - values cached as bf16 (``type_v="bf16"``, keys f16): llama.cpp's CPU flash attention splits a
      one-token step over the cached positions, one part per thread, when keys and values are both f16
      (from 512 positions of the context's view, about 256 cached ones), and merges the parts, while a
      verify batch computes each row over all positions; with f16 values each part also accumulates in
      f16, so the two differ by up to ~1 logit after the quantized products (measured on the default
      model). With bf16 values (or any other than f16/f32) that split is never taken: every row, of a
      step or of a batch, is computed over all positions with an f32 accumulator, on any number of
      threads. So one-token steps run on every physical core (``n_threads=None``), bit-identical to a
      verify batch. The exactness probe flags settings that split (``split_steps``).
    """

    n_threads: int | None = None
    """Threads of one-token steps; ``None``: the physical cores this process may use."""
    n_threads_batch: int | None = None
    """Threads of multi-token batches (prompts, verification); ``None``: the physical cores this process may use."""
    n_batch: int = 512
    """Most tokens per ``llama_decode`` call."""
    n_ubatch: int = 512
    """Tokens per physical micro-batch (at most ``n_batch``); prompts are fed in balanced chunks of at most this many."""
    flash_attn: bool = True
    """Flash attention (``True`` keeps speculative output identical to plain decoding)."""
    n_ctx: int | None = None
    """Context window in tokens; ``None``: the model's training context, allocated as requests need it."""
    type_k: str = "f16"
    """Type of the cached keys (``f16``, ``bf16``, ``f32``, ``q8_0``, ``q4_0``, ``q4_1``, ``q5_0``, ``q5_1``, ``iq4_nl``)."""
    type_v: str = "bf16"
    """Type of the cached values (the same names; quantized ones need flash attention). With f16 or f32
    keys and values, several threads make one-token steps round otherwise than verify batches (see above)."""

    def __post_init__(self) -> None:
        for name in ("n_threads", "n_threads_batch", "n_ctx", "n_batch", "n_ubatch"):
            value = getattr(self, name)
            if value is None and name in ("n_threads", "n_threads_batch", "n_ctx"):
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.n_ubatch > self.n_batch:
            raise ValueError(f"n_ubatch ({self.n_ubatch}) must be at most n_batch ({self.n_batch})")
        if not isinstance(self.flash_attn, bool):
            raise ValueError(f"flash_attn must be True or False, got {self.flash_attn!r}")
        for name in ("type_k", "type_v"):
            if getattr(self, name) not in _KV_TYPES:
                raise ValueError(f"{name} must be one of {', '.join(_KV_TYPES)}, got {getattr(self, name)!r}")
        if self.type_v not in ("f32", "f16", "bf16") and not self.flash_attn:
            raise ValueError(f"type_v={self.type_v!r} needs flash_attn=True (llama.cpp stores such values only for it)")

    @property
    def split_steps(self) -> bool:
        """Whether llama.cpp splits a one-token step's attention over threads (beyond ~256 cached positions),
        so that a verify batch rounds otherwise: several threads, flash attention, f16/f32 keys and values."""
        return self.threads > 1 and self.flash_attn and {self.type_k, self.type_v} <= _SPLIT_KV_TYPES

    @property
    def threads(self) -> int:
        return self.n_threads or physical_cores()

    @property
    def threads_batch(self) -> int:
        return self.n_threads_batch or physical_cores()


# -- the library ------------------------------------------------------------------------------
_init_lock = threading.Lock()
_initialized = False


def _lib() -> Any:
    """The ``llama_cpp`` module, initialised once; a clear error when it is missing or too different."""
    global _initialized
    try:
        with needs("llamacpp", "the llama.cpp back end", _BUILD_NOTE):
            import llama_cpp
    except MissingExtraError:
        raise
    except (ImportError, OSError) as e:  # installed, but its library does not load
        raise BackendUnavailableError(
            f"the llama.cpp back end could not load llama-cpp-python=={PINNED_VERSION} ({e}): reinstall it with "
            f"`{INSTALL_HINT}`, or use backend='torch'"
        ) from e
    missing = [name for name in _NEEDED if not hasattr(llama_cpp, name)]
    if missing:
        raise BackendUnavailableError(
            f"llama-cpp-python {getattr(llama_cpp, '__version__', '?')} lacks {', '.join(missing)}; ragspec drives "
            f"version {PINNED_VERSION}: install it with `{INSTALL_HINT}`"
        )
    with _init_lock:
        if not _initialized:
            _route_log(llama_cpp)
            llama_cpp.llama_backend_init()
            _initialized = True
    return llama_cpp


_GGML_LEVELS = {1: logging.DEBUG, 2: logging.INFO, 3: logging.WARNING, 4: logging.ERROR}  # ggml_log_level
_llama_log = logging.getLogger("ragspec.llamacpp")
"""llama.cpp's own log; silent unless the application configures logging."""
_llama_log.addHandler(logging.NullHandler())
_recent: deque[str] = deque(maxlen=12)  # llama.cpp's latest warnings and errors, for error messages
_log_level = [logging.INFO]
_log_callback: Any = None


def _forward_log(level: int, text: bytes, _: object) -> None:
    if level != 5:  # 5 continues the previous message
        _log_level[0] = _GGML_LEVELS.get(level, logging.DEBUG)
    line = text.decode("utf-8", "replace").rstrip()
    if _log_level[0] >= logging.WARNING and line:
        _recent.append(line)
    if line and _llama_log.isEnabledFor(_log_level[0]):
        _llama_log.log(_log_level[0], "%s", line)


def _route_log(lib: Any) -> None:
    """Send llama.cpp's log (global to the process) to the ``ragspec.llamacpp`` logger instead of stderr.

    llama-cpp-python prints it to stderr by default: a model load writes hundreds of lines.
    """
    global _log_callback
    if _log_callback is None:
        _log_callback = lib.llama_log_callback(_forward_log)  # kept referenced: C holds the pointer
        lib.llama_log_set(_log_callback, ctypes.c_void_p(0))


@contextmanager
def _captured_log() -> Iterator[deque[str]]:
    """llama.cpp's warnings and errors while the block runs (for error messages)."""
    _recent.clear()
    yield _recent


def _said(lines: deque[str]) -> str:
    text = " ".join(line for line in lines if line)
    return f" (llama.cpp: {text[-400:]})" if text else ""


# -- the model --------------------------------------------------------------------------------
class LlamaCppModel:
    """A GGUF file loaded by llama.cpp (weights memory-mapped once) and its Hugging Face tokenizer.

    Shared by every ``LlamaCppBackend`` (context) built on it, like a ``LoadedModel`` for PyTorch;
    ``device`` and ``dtype`` describe the logits it returns (fp32 on the CPU).
    """

    backend = "llamacpp"
    device = torch.device("cpu")
    dtype = torch.float32
    verify_matches_steps = True
    """Drafting stays on: whether a verify batch computes what one-token steps do is probed per settings
    (``exact``), with a warning where it does not."""

    def __init__(self, path: Path, name: str, tokenizer: PreTrainedTokenizerBase, settings: LlamaCppSettings,
                 lib: Any, handle: Any) -> None:
        self.path = path
        self.name = name
        self.tokenizer = tokenizer
        self.settings = settings
        self.lib = lib
        self.handle = handle
        self._finalizer = weakref.finalize(self, lib.llama_model_free, handle)
        vocab = lib.llama_model_get_vocab(handle)
        self.n_vocab = int(lib.llama_vocab_n_tokens(vocab))
        trained = int(lib.llama_model_n_ctx_train(handle))
        self.context_length = min(settings.n_ctx or trained, trained)
        """Longest sequence (prompt + answer) a context takes: ``settings.n_ctx``, at most the trained context."""
        eos = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
        eos.update(t for t in range(self.n_vocab) if lib.llama_vocab_is_eog(vocab, t))
        self.eos_token_ids = frozenset(int(t) for t in eos)
        """The tokenizer's EOS and every end-of-generation token of the file (EOS, end of turn, ...):
        where llama.cpp's own generation stops."""
        self.quantization = (lib.llama_ftype_name(lib.llama_model_ftype(handle)) or b"?").decode()
        stat = path.stat()
        self.fingerprint = f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}"
        """Identity of the weights (for caches keyed by model): the file's path, size and modification time."""
        self.size_bytes = int(lib.llama_model_size(handle))
        self.exact: bool | None = None
        """Whether a verify batch computes bit for bit what one-token steps do with these settings
        (checked by the first back end built on it; see ``LlamaCppBackend._check_exactness``)."""

    def close(self) -> None:
        """Free the weights now (back ends built on it must not be used afterwards)."""
        self._finalizer()


def load_llamacpp(path: str | Path, name: str | None = None, settings: LlamaCppSettings | None = None) -> LlamaCppModel:
    """Load a GGUF file with llama.cpp, and the tokenizer stored in it (never the PyTorch weights)."""
    path = Path(path).expanduser()
    settings = settings if settings is not None else LlamaCppSettings()
    if not path.is_file():
        raise ModelLoadError(f"GGUF file not found: {path}")
    with path.open("rb") as f:
        magic = f.read(4)
    if magic != _GGUF_MAGIC:
        raise ModelLoadError(
            f"{path} is not a GGUF file (it does not start with {_GGUF_MAGIC!r}): the llama.cpp back end runs GGUF "
            "files; convert the model with llama.cpp's convert_hf_to_gguf.py, or load a transformers model "
            "directory with backend='torch'"
        )
    lib = _lib()
    params = lib.llama_model_default_params()
    params.n_gpu_layers = 0
    with _captured_log() as log:
        handle = lib.llama_model_load_from_file(str(path).encode(), params)
    if not handle:
        raise ModelLoadError(
            f"llama.cpp could not load {path}{_said(log)}: the file is damaged, or its architecture or format is "
            f"unknown to llama-cpp-python {getattr(lib, '__version__', '?')}; re-convert it with a matching "
            "llama.cpp release, or try backend='torch' (transformers de-quantizes many GGUF files)"
        )
    try:
        if lib.llama_model_has_encoder(handle) or lib.llama_model_is_recurrent(handle) or lib.llama_model_is_hybrid(handle):
            raise ModelLoadError(
                f"{path} is an encoder-decoder or recurrent model: speculative decoding needs a decoder whose KV "
                "cache can be rolled back by position; use a decoder-only transformer GGUF"
            )
        tokenizer = gguf_tokenizer(path)
        n_vocab = int(lib.llama_vocab_n_tokens(lib.llama_model_get_vocab(handle)))
        if len(tokenizer) != n_vocab:
            raise ModelLoadError(
                f"the tokenizer read from {path} has {len(tokenizer)} tokens but llama.cpp's vocabulary has {n_vocab}: "
                "token ids would not match; use backend='torch' for this file"
            )
    except BaseException:
        lib.llama_model_free(handle)
        raise
    lm = LlamaCppModel(path, name or path.stem, tokenizer, settings, lib, handle)
    if lm.quantization in _ROW_BY_ROW:
        logger.info("%s is %s, which llama.cpp multiplies row by row in a verify batch (8 drafted tokens cost ~3 "
                    "plain steps): drafting gains less than with a type it tiles (benchmarks/llama_quant.py "
                    "compares them)", path.name, lm.quantization)
    return lm


# -- a context: KV cache and forward ------------------------------------------------------------
class LlamaCppCache:
    """The positions held in a ``LlamaCppBackend``'s context (sequence 0 of its memory)."""

    def __init__(self, backend: LlamaCppBackend) -> None:
        self._backend = backend
        self.tokens: list[int] = []
        """The ids whose keys and values the cache holds, in position order."""

    @property
    def length(self) -> int:
        return len(self.tokens)

    def get_seq_length(self) -> int:
        return self.length

    def crop(self, tokens_to_remove: int) -> None:
        """Remove ``-tokens_to_remove`` positions from the end (transformers' negative convention)."""
        if tokens_to_remove > 0:
            raise ValueError(f"crop takes a negative count of positions to remove, got {tokens_to_remove}")
        keep = max(self.length + tokens_to_remove, 0)
        if keep < self.length:
            self._backend._truncate(self, keep)


def _free_batch(lib: Any, batch: Any) -> None:
    lib.llama_batch_free(batch)


_MIN_CONTEXT = 1024  # positions a context is first made with (rounded up to a multiple of 256)


@dataclass
class SavedLlamaState:
    """Sequence 0's state (keys, values, positions) copied out of a context, for ``LlamaCppBackend.load``."""

    state: Any
    """``ctypes`` bytes from ``llama_state_seq_get_data``."""
    nbytes: int
    tokens: list[int]
    """The ids of the positions it holds."""
    live: LlamaCppCache | None
    """The cache it was saved from while the context still holds it unchanged (no copy back needed)."""


class LlamaCppBackend:
    """One llama.cpp context over a ``LlamaCppModel``: its KV cache (one sequence) and the forward.

    A context holds one cache at a time: ``new_cache`` empties it and hands out a new cache object,
    and the previous one can no longer be used (the generator never uses two at once).

    Memory: llama.cpp allocates (and zeroes) a context's whole KV cache when it is created, ~23 KB
    per position for the default model (190 MB at its 8192-token window). Unless
    ``LlamaCppSettings.n_ctx`` fixes the size, a context is therefore made for the positions a
    request asks for (at least 1024) and grown when a later request needs more: a new context is
    created and the cached positions' keys and values are copied into it (exact, no recompute).
    """

    name = "llamacpp"

    def __init__(self, target: LlamaCppModel) -> None:
        lib, s = target.lib, target.settings
        self.target, self._lib, self._settings = target, lib, s
        self.model_name = target.name
        self.tokenizer = target.tokenizer
        self.context_length = target.context_length
        self.eos_token_ids = target.eos_token_ids
        self.device = target.device
        self.vocab_size = target.n_vocab
        self._n_batch = s.n_batch
        batch = lib.llama_batch_init(s.n_batch, 0, 1)
        self._batch = batch
        self._batch_finalizer = weakref.finalize(self, _free_batch, lib, batch)
        for i in range(s.n_batch):  # every token belongs to sequence 0
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
        self._tokens = np.ctypeslib.as_array(batch.token, shape=(s.n_batch,))
        self._positions = np.ctypeslib.as_array(batch.pos, shape=(s.n_batch,))
        self._wants_logits = np.ctypeslib.as_array(batch.logits, shape=(s.n_batch,))
        self._ctx: Any = None
        self._ctx_finalizer: weakref.finalize | None = None
        self.n_ctx = 0
        """Positions the current context holds (0 before the first cache)."""
        self._active: LlamaCppCache | None = None
        self._make_context(s.n_ctx or min(_MIN_CONTEXT, self.context_length))
        if target.exact is None:
            target.exact = self._check_exactness()
        attention = "on" if s.flash_attn else "off"
        self.description = (
            f"llama.cpp (llama-cpp-python {getattr(lib, '__version__', '?')}, {target.quantization}, "
            f"{s.threads}/{s.threads_batch} threads, n_batch {s.n_batch}, n_ubatch {s.n_ubatch}, flash attention {attention}, "
            f"KV {s.type_k}/{s.type_v})"
        )

    # -- contexts -----------------------------------------------------------------------------
    def _make_context(self, positions: int) -> None:
        """Replace the context by an empty one of at least ``positions`` (at most the model's window)."""
        lib, s = self._lib, self._settings
        n_ctx = min(-(-positions // 256) * 256, self.context_length)
        params = lib.llama_context_default_params()
        params.n_ctx = n_ctx
        params.n_batch = s.n_batch
        params.n_ubatch = s.n_ubatch
        params.n_seq_max = 1
        params.n_threads = s.threads
        params.n_threads_batch = s.threads_batch
        params.flash_attn_type = lib.LLAMA_FLASH_ATTN_TYPE_ENABLED if s.flash_attn else lib.LLAMA_FLASH_ATTN_TYPE_DISABLED
        params.type_k = kv_type_id(s.type_k)
        params.type_v = kv_type_id(s.type_v)
        params.no_perf = True
        with _captured_log() as log:
            ctx = lib.llama_init_from_model(self.target.handle, params)
        if not ctx:
            raise ModelLoadError(
                f"llama.cpp could not create a context for {self.target.name} with n_ctx={n_ctx}, "
                f"n_batch={s.n_batch}{_said(log)}: lower n_ctx or n_batch in LlamaCppSettings"
            )
        if self._ctx_finalizer is not None:
            self._ctx_finalizer()  # frees the old context
        self._ctx, self.n_ctx = ctx, n_ctx
        self._ctx_finalizer = weakref.finalize(self, lib.llama_free, ctx)
        self._memory = lib.llama_get_memory(ctx)

    def _grow(self, positions: int) -> None:
        """A context of at least ``positions``, holding the current one's cached positions."""
        lib, old = self._lib, self._ctx
        size = lib.llama_state_seq_get_size(old, 0)
        state = (ctypes.c_uint8 * size)()
        written = lib.llama_state_seq_get_data(old, state, size, 0)
        self._make_context(max(positions, 2 * self.n_ctx))
        if written != size or lib.llama_state_seq_set_data(self._ctx, state, size, 0) != size:
            self._active = None  # nothing cached survives: callers must start a new cache
            raise RuntimeError("llama.cpp could not copy the KV cache into a larger context")

    def _check_exactness(self) -> bool:
        """Evaluate a few positions one by one and as one batch; warn when they differ.

        They differ where llama.cpp multiplies this file's weight type with another kernel for
        batches than for one row (seen here for K-quants such as Q4_K_M; Q4_0, Q4_1 and Q8_0 agree),
        or with ``flash_attn=False``, or with several threads for one-token steps over f16 keys and values
        (flagged as such: the probe stays under 256 positions, where they do not change a step's attention
        yet, ``LlamaCppSettings.split_steps``). Speculation then still works, but its greedy output can differ from
        plain decoding.
        """
        s = self._settings
        ids = [(7919 * i) % max(self.vocab_size - 16, 1) + 8 for i in range(_TILE_ROWS + 12)]
        cache = self.new_cache(len(ids))
        self.forward(ids[:_TILE_ROWS], cache, last_only=True)
        steps = torch.cat([self.forward([t], cache).clone() for t in ids[_TILE_ROWS:]])
        cache = self.new_cache(len(ids))
        self.forward(ids[:_TILE_ROWS], cache, last_only=True)
        batched = self.forward(ids[_TILE_ROWS:], cache)
        reasons = []
        if not torch.equal(steps, batched):
            reasons.append(f"its {self.target.quantization} weights are multiplied by another kernel in batches "
                           f"(logits up to {float((steps - batched).abs().max()):.2g} apart)")
        if not s.flash_attn:
            reasons.append("flash_attn=False")
        if s.split_steps:
            reasons.append(f"{s.threads} threads for one-token steps with {s.type_k} keys and {s.type_v} values "
                           "(llama.cpp then splits one token's attention over threads from ~256 cached positions, "
                           "a verify batch does not; type_v='bf16' avoids it)")
        self._active = None
        if reasons:
            logger.warning("speculative greedy output of %s on llama.cpp can differ from plain decoding beyond "
                           "argmax ties: %s", self.target.name, "; ".join(reasons))
        return not reasons

    def new_cache(self, capacity: int) -> LlamaCppCache:
        """An empty cache (the context's memory cleared), in a context of at least ``capacity`` positions."""
        if capacity > self.n_ctx and self.n_ctx < self.context_length and self._settings.n_ctx is None:
            self._make_context(capacity)
        else:
            self._lib.llama_memory_clear(self._memory, False)
        self._active = LlamaCppCache(self)
        return self._active

    def _check(self, cache: LlamaCppCache) -> None:
        if cache is not self._active:
            raise RuntimeError(
                "this KV cache was replaced by a newer one of the same llama.cpp back end (a context holds one cache)"
            )

    def _truncate(self, cache: LlamaCppCache, keep: int) -> None:
        self._check(cache)
        if not self._lib.llama_memory_seq_rm(self._memory, 0, keep, -1):
            raise RuntimeError(f"llama.cpp could not remove positions {keep}.. from its memory")
        del cache.tokens[keep:]

    def save(self, cache: LlamaCppCache) -> SavedLlamaState | None:
        """Copy the cache's positions out of the context (they survive later requests and new contexts).

        None for fewer than 64 positions: a prompt that short was evaluated in one batch of under 64
        rows, whose attention rounds otherwise than the tiled kernel that evaluates longer prompts
        (``LlamaCppSettings``), so a longer prompt reusing them would not get a cold prefill's logits.
        """
        self._check(cache)
        if cache.length < _TILE_ROWS:
            return None
        lib = self._lib
        size = lib.llama_state_seq_get_size(self._ctx, 0)
        state = (ctypes.c_uint8 * size)()
        if lib.llama_state_seq_get_data(self._ctx, state, size, 0) != size:
            raise RuntimeError("llama.cpp could not copy the KV cache out of its context")
        return SavedLlamaState(state, size, list(cache.tokens), cache)

    def load(self, saved: SavedLlamaState, length: int, capacity: int) -> LlamaCppCache:
        """A cache holding the first ``length`` positions of ``saved``: the context's own when it still
        holds them, else ``saved`` copied into an emptied context."""
        if length > len(saved.tokens):
            raise ValueError(f"the saved state holds {len(saved.tokens)} positions, not {length}")
        live, saved.live = saved.live, None  # from here on the context's cache changes
        if live is not None and live is self._active and live.length >= length and capacity <= self.n_ctx:
            self._truncate(live, length)
            return live
        cache = self.new_cache(capacity)
        lib = self._lib
        if lib.llama_state_seq_set_data(self._ctx, saved.state, saved.nbytes, 0) != saved.nbytes:
            raise RuntimeError("llama.cpp could not copy a saved KV cache into its context")
        cache.tokens = list(saved.tokens)
        self._truncate(cache, length)
        return cache

    # -- forward ------------------------------------------------------------------------------
    def forward(
        self, ids: list[int], cache: LlamaCppCache, last_only: bool = False, cancel: threading.Event | None = None
    ) -> torch.Tensor:
        """Evaluate ``ids`` after the cached positions (see ``Backend.forward``).

        ``last_only`` marks a prompt: it is evaluated in balanced chunks of at least 64 rows where
        it has that many, re-evaluating up to 63 cached positions when only a few are new.
        Otherwise (verification) rows are evaluated in chunks of at most 63, each row exactly as a
        one-token step would. See ``LlamaCppSettings`` for why.
        """
        self._check(cache)
        ids = [int(t) for t in ids]
        if not ids:
            raise ValueError("forward needs at least one token")
        if last_only and len(ids) < _TILE_ROWS and cache.length:
            back = min(cache.length, _TILE_ROWS - len(ids))
            ids = cache.tokens[-back:] + ids
            self._truncate(cache, cache.length - back)
        n, start = len(ids), cache.length
        if start + n > self.n_ctx:
            if start + n > self.context_length:
                raise ValueError(f"{start + n} positions do not fit the model's context of {self.context_length} tokens")
            self._grow(start + n)
        limit = min(self._n_batch, self._settings.n_ubatch) if last_only else min(self._n_batch, _TILE_ROWS - 1)
        chunks = -(-n // limit)
        bounds = [start + n * i // chunks for i in range(chunks + 1)]  # balanced: no short last chunk
        rows: list[torch.Tensor] = []
        for lo, hi in zip(bounds, bounds[1:]):
            check_cancelled(cancel)  # between llama.cpp's batches
            out = self._decode(ids[lo - start : hi - start], lo, cache, first_output=start + n - 1 if last_only else lo)
            if out is not None:
                rows.append(out if hi == bounds[-1] else out.clone())  # the buffer is reused by the next chunk
        return rows[0] if len(rows) == 1 else torch.cat(rows)

    def _decode(self, ids: list[int], start: int, cache: LlamaCppCache, first_output: int) -> torch.Tensor | None:
        """One ``llama_decode`` of ``ids`` at positions ``start..``; logits of positions ``first_output..``."""
        m = len(ids)
        self._tokens[:m] = ids
        self._positions[:m] = np.arange(start, start + m, dtype=np.int32)
        out = max(first_output - start, 0)
        self._wants_logits[:m] = 0
        self._wants_logits[out:m] = 1
        self._batch.n_tokens = m
        status = self._lib.llama_decode(self._ctx, self._batch)
        if status != 0:
            self._lib.llama_memory_seq_rm(self._memory, 0, start, -1)  # forget this call's partial work
            raise RuntimeError(f"llama_decode failed with status {status} at positions {start}..{start + m - 1}")
        cache.tokens.extend(ids)
        return self._logits(m - out) if out < m else None

    def _logits(self, rows: int) -> torch.Tensor:
        """The last decode's output rows as a ``[rows, vocab]`` fp32 tensor sharing llama.cpp's buffer."""
        pointer = self._lib.llama_get_logits(self._ctx)
        return torch.from_numpy(np.ctypeslib.as_array(pointer, shape=(rows, self.vocab_size)))
