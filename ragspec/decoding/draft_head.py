"""A draft head: one token guessed from the target's own last hidden state, where no copy fits.

A small network on top of the target (in the spirit of Medusa, Cai et al. 2024, and EAGLE, Li et al.
2024: features of the target's last layer plus the token just chosen predict the token after it)
maps the final-norm hidden state at position ``t`` and the token at ``t + 1`` to a guess of the token
at ``t + 2``, over a reduced vocabulary whose output rows are the target's own LM head's. It costs a
few small products per step, against a draft model's whole forward, and it drafts one token: the
target verifies it like any draft, so the answer stays plain decoding's whatever the head says.

Heads are trained per target by ``benchmarks/train_draft_head.py`` and ship inside the package
(``ragspec/data/<model>.draft-head.safetensors``); ``head_drafter`` loads the one of a model, if any, where
the back end keeps hidden states: the PyTorch back end's Llama forward does (``TorchBackend.hidden_at``);
llama.cpp and transformers' own forward do not. ``SpeculativeGenerator(draft_head=True)`` drafts with it; it
is off by default, for the measured reason in docs/model-drafter.md ("The draft head").
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import torch
import torch.nn.functional as F
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import nn

from ragspec.backends import Backend
from ragspec.backends.pytorch import TorchBackend
from ragspec.engine.drafting import Draft, DraftSource

HEADS = Path(__file__).resolve().parents[1] / "data"
"""Where the bundled heads are, one per target model name."""


def head_path(model_name: str) -> Path:
    """The bundled head file of the target called ``model_name``."""
    return HEADS / f"{model_name}.draft-head.safetensors"


class DraftHead(nn.Module):
    """``[hidden_t; embedding(token_{t+1})]`` -> a residual SiLU block -> RMS norm -> logits over ``vocab``.

    ``embed`` and ``lm_head`` are the target's (not trained, not saved): ``lm_head`` keeps only the rows of
    ``vocab``, the ids the head may guess."""

    def __init__(self, embed: torch.Tensor, lm_head: torch.Tensor, vocab: torch.Tensor, width: int, eps: float = 1e-5) -> None:
        super().__init__()
        dim = embed.shape[1]
        self.embed = embed
        self.register_buffer("vocab", vocab.to(torch.int64))
        self.out = lm_head[vocab].clone()
        self.inp = nn.Linear(2 * dim, dim)
        self.up = nn.Linear(dim, width)
        self.down = nn.Linear(width, dim)
        self.norm = nn.RMSNorm(dim, eps=eps)
        self.metadata: dict[str, str] = {}
        """What its file says of it (``save``'s ``metadata``: the training script writes how it was trained)."""

    def forward(self, hidden: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
        """Logits over ``vocab`` (``[..., len(vocab)]``) for hidden states ``[..., dim]`` and the tokens after them."""
        z = self.inp(torch.cat([hidden, self.embed[token]], -1))
        z = z + self.down(F.silu(self.up(z)))
        return self.norm(z) @ self.out.T

    def guess(self, hidden: torch.Tensor, token: int) -> int:
        """The most likely token id after ``token`` (whose predecessor's hidden state is ``hidden``)."""
        return int(self.vocab[self.forward(hidden, torch.tensor(token, device=hidden.device)).argmax()])

    def save(self, path: Path, metadata: dict[str, str]) -> None:
        """Trained weights (in fp16: half the file, and a guess moves by a rounding at most) and ``vocab`` as
        safetensors (no pickle), with ``metadata`` (strings)."""
        tensors = {k: (v.half() if v.is_floating_point() else v).detach().contiguous() for k, v in self.state_dict().items()}
        save_file(tensors, str(path), metadata={**metadata, "width": str(self.up.out_features)})

    @classmethod
    def load(cls, path: Path, embed: torch.Tensor, lm_head: torch.Tensor) -> DraftHead:
        """A head saved by ``save``, on the target's ``embed`` and ``lm_head`` (their device and dtype)."""
        with safe_open(str(path), "pt") as f:  # one read: the tensors and the metadata
            tensors = {k: f.get_tensor(k) for k in f.keys()}
            metadata = dict(f.metadata() or {})
        head = cls(embed, lm_head, tensors["vocab"], tensors["up.weight"].shape[0])
        head.load_state_dict(tensors)
        head.metadata = metadata
        return head.to(device=embed.device, dtype=embed.dtype).eval()


class HiddenStates(Protocol):
    """What keeps the target's last final-norm hidden states (``TorchBackend``)."""

    def hidden_at(self, position: int) -> torch.Tensor | None:
        """The hidden state at ``position`` if the last forward computed it, else None."""
        ...


class HeadDrafter:
    """Drafts the head's one token after the context (``DraftSource.MODEL``: the policy treats it as a draft
    model's, measuring its cost and acceptance, and asks for it only where no copy is worth verifying)."""

    longest = 1
    """Most tokens one ``propose`` returns."""

    def __init__(self, head: DraftHead, states: HiddenStates) -> None:
        self.head = head
        self.states = states
        held_out = head.metadata.get("held_out_accuracy")
        self.acceptance = float(held_out) if held_out is not None else None
        """The head's accuracy on answers held out of its training (the policy's prior acceptance), if known."""

    def begin(self, prompt: Sequence[int], references: Sequence[Sequence[int]]) -> None:
        """Nothing is kept per request."""

    @torch.inference_mode()
    def propose(self, context: Sequence[int], max_tokens: int) -> Draft | None:
        # The newest token (not yet evaluated) follows the position before it, whose hidden state the forward
        # that chose it computed.
        hidden = self.states.hidden_at(len(context) - 2) if max_tokens > 0 and len(context) >= 2 else None
        if hidden is None:
            return None
        return Draft((self.head.guess(hidden, context[-1]),), DraftSource.MODEL)

    def feedback(self, draft: Draft, n_accepted: int) -> None:
        """The policy keeps the acceptance."""

    def finish(self, output: Sequence[int]) -> None:
        """Nothing is kept per request."""

    def clear_cache(self) -> None:
        """There is no cache."""


def head_drafter(backend: Backend, path: Path | None = None) -> HeadDrafter | None:
    """A drafter of the head saved at ``path`` (None: the bundled head of the back end's model, if there is one)
    on ``backend``. None when there is no bundled head or the back end keeps no hidden states (llama.cpp,
    transformers' own forward); a ``path`` given that cannot be used raises ``ValueError``."""
    name = backend.model_name
    usable = isinstance(backend, TorchBackend) and backend.keeps_hidden
    if path is None:
        path = head_path(name)
        if not path.is_file() or not usable:
            return None
    elif not path.is_file():
        raise ValueError(f"draft_head: no file at {str(path)!r}")
    elif not usable:
        raise ValueError(f"draft_head: the {backend.name} back end of {name!r} keeps no hidden states for a draft "
                         "head (only the PyTorch back end's Llama forward does)")
    model = backend.target.model  # type: ignore[union-attr]
    embed, lm_head = model.get_input_embeddings().weight.detach(), model.get_output_embeddings().weight.detach()
    try:
        head = DraftHead.load(path, embed, lm_head)
    except (OSError, SafetensorError, KeyError, RuntimeError, IndexError) as e:  # not a head, or one of other shapes
        raise ValueError(f"draft_head: {str(path)!r} is not a draft head of {name!r}: {e}") from None
    if head.metadata.get("model") != name:  # shapes alone do not tell models of one size apart
        raise ValueError(f"draft_head: {str(path)!r} is not a draft head of {name!r}: it was trained for "
                         f"{head.metadata.get('model')!r}")
    return HeadDrafter(head, backend)
