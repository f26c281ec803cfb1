"""Train the draft head of the default model (``ragspec.decoding.draft_head``) and write it where the package finds it.

Training pairs come from one fp32 forward of the target over each recorded answer of ``--sets`` with the
pipeline's own prompt (question and the answer's passages, as ``ragspec.prompts.qa_prompt_ids`` builds it):
at every position ``t`` the input is the target's final-norm hidden state at ``t`` and the token at ``t + 1``,
the label the target's own greedy choice at ``t + 1``, i.e. what plain decoding would write after that token.
So the head learns the target's behaviour, not the recorded text's. Answer positions count ``--answer-weight``
times (the head drafts in answers; the prompt's positions are mostly passage text). Every tenth answer is held
out: the share of its answer positions the head guesses right is saved with the head (``held_out_accuracy``),
and the decoding policy starts from it as the head's acceptance. The default sets are the answers recorded
for issue 37's question sets ``support``, ``fresh2`` and ``fresh3`` (questions over the bundled corpus); the
unseen-question sets the speed figures are measured on (``heldout_questions.json``, ``fresh_questions.json``)
are not among them. The vocabulary is the ``--vocab`` most frequent labels; positions with another label are
left out. A few minutes on 2 cores:

    python benchmarks/train_draft_head.py [--epochs 8] [--answer-weight 10] [--width 576] [--vocab 4096] [--limit N] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from langchain_core.documents import Document  # noqa: E402

from ragspec.backends import load_model  # noqa: E402
from ragspec.decoding.draft_head import DraftHead, head_path  # noqa: E402
from ragspec.prompts import qa_prompt_ids  # noqa: E402

DATA = Path(__file__).resolve().parent / "data"
SETS = ("support", "fresh2", "fresh3", "head")
UNSEEN = ("heldout_questions.json", "fresh_questions.json")


@dataclass
class Pairs:
    """Training pairs: hidden states ``[n, dim]``, the tokens after them, the target's greedy token after those,
    and whether that label lies in the answer (else in the prompt)."""

    hidden: torch.Tensor
    tokens: torch.Tensor
    labels: torch.Tensor
    answer: torch.Tensor

    def __getitem__(self, rows: torch.Tensor) -> Pairs:
        return Pairs(self.hidden[rows], self.tokens[rows], self.labels[rows], self.answer[rows])


@torch.inference_mode()
def pairs(model, tokenizer, records: list[dict[str, Any]]) -> Pairs:  # type: ignore[no-untyped-def]
    """The pairs of ``records`` (recorded answers with their question and passages)."""
    hidden, tokens, labels, answer = [], [], [], []
    for a in records:
        docs = [Document(page_content=p["text"], metadata={"source": p["source"]}) for p in a["passages"]]
        prompt = qa_prompt_ids(tokenizer, a["question"], docs)
        ids = prompt + tokenizer.encode(a["text"], add_special_tokens=False)
        out = model(torch.tensor([ids]), output_hidden_states=True)
        hidden.append(out.hidden_states[-1][0, :-2].float())  # after the final norm
        tokens.append(torch.tensor(ids[1:-1]))
        labels.append(out.logits[0, 1:-1].argmax(-1))
        answer.append(torch.arange(2, len(ids)) >= len(prompt))  # the label's position is in the answer
    return Pairs(torch.cat(hidden), torch.cat(tokens), torch.cat(labels), torch.cat(answer))


def records(sets: list[str]) -> list[dict[str, Any]]:
    """The recorded answers of ``sets`` with their passages' text, less every answer to a question of the
    unseen-question sets (``fresh2`` answered ``fresh_questions.json``'s questions: they must not train the head
    the speed is measured with). A set's passages are either inline or indexes into its ``chunks``."""
    unseen = {q["question"] for f in UNSEEN for q in json.loads((DATA / f).read_text())["questions"]}
    out = []
    for s in sets:
        data = json.loads((DATA / f"{s}_answers.json").read_text())
        for a in data["answers"]:
            if a["question"] not in unseen:
                out.append({**a, "passages": [data["chunks"][p] if isinstance(p, int) else p for p in a["passages"]]})
    return out


def train(head: DraftHead, hidden: torch.Tensor, tokens: torch.Tensor, targets: torch.Tensor, epochs: int,
          batch: int = 512, seed: int = 0) -> float:
    """AdamW on cross-entropy over the head's vocabulary (``targets`` index it); returns the last epoch's accuracy
    (of the batches as they were trained on)."""
    torch.manual_seed(seed)
    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01)
    accuracy = 0.0
    for epoch in range(epochs):
        right = 0
        for b in torch.randperm(len(targets)).split(batch):
            logits = head(hidden[b], tokens[b])
            loss = F.cross_entropy(logits, targets[b])
            opt.zero_grad()
            loss.backward()
            opt.step()
            right += int((logits.argmax(-1) == targets[b]).sum())
        accuracy = right / len(targets)
        print(f"epoch {epoch + 1}: loss {loss.item():.3f}, training accuracy {accuracy:.3f}", flush=True)
    return accuracy


@torch.inference_mode()
def accuracy(head: DraftHead, data: Pairs) -> float:
    """How often the head's guess is the target's own token, on answer positions (where it drafts)."""
    data = data[data.answer]
    return float((head.vocab[head(data.hidden, data.tokens).argmax(-1)] == data.labels).float().mean()) if len(data.labels) else 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sets", nargs="+", default=list(SETS), help="recorded answer sets (benchmarks/data/<set>_answers.json)")
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--answer-weight", type=int, default=10,
                    help="each answer position counts this many times (the head drafts in answers; prompts are passages)")
    ap.add_argument("--width", type=int, default=576, help="width of the residual block")
    ap.add_argument("--vocab", type=int, default=4096, help="most ids the head may guess (the most frequent labels)")
    ap.add_argument("--limit", type=int, default=None, help="use only the first N recorded answers")
    ap.add_argument("--out", type=Path, default=None, help="default: where the package looks for the default model's head")
    args = ap.parse_args()
    if args.limit is not None and args.limit < 10:
        ap.error("--limit must be at least 10: every tenth answer is held out")

    t0 = time.perf_counter()
    lm = load_model("default", device="cpu", dtype="float32", backend="torch")
    model = lm.model.eval()
    answers = records(args.sets)[: args.limit]
    # Every tenth answer is held out: its accuracy is the head's expected acceptance (the policy's prior).
    data, held = pairs(model, lm.tokenizer, [a for i, a in enumerate(answers) if i % 10 != 9]), pairs(model, lm.tokenizer, answers[9::10])
    vocab = torch.tensor([t for t, _ in Counter(data.labels.tolist()).most_common(args.vocab)])
    index = torch.full((int(model.config.vocab_size),), -1, dtype=torch.int64)
    index[vocab] = torch.arange(len(vocab))
    kept = data[index[data.labels] >= 0]
    print(f"{len(data.labels)} positions ({int(data.answer.sum())} in answers), {len(kept.labels)} with a label among "
          f"the {len(vocab)} ids of the vocabulary; {int(held.answer.sum())} held-out answer positions "
          f"({time.perf_counter() - t0:.0f} s)", flush=True)
    weighted = torch.cat([torch.arange(len(kept.labels))] + [kept.answer.nonzero().flatten()] * (args.answer_weight - 1))
    kept = kept[weighted]
    embed = model.get_input_embeddings().weight.detach()
    head = DraftHead(embed, model.get_output_embeddings().weight.detach(), vocab, args.width)
    trained = train(head, kept.hidden, kept.tokens, index[kept.labels], args.epochs)
    held_out = accuracy(head.eval(), held)
    print(f"held-out answer positions: {held_out:.3f} of the guesses are the target's token")
    out = args.out or head_path(lm.name)
    head.save(out, {"model": lm.name, "sets": ",".join(args.sets), "positions": str(len(kept.labels)),
                    "epochs": str(args.epochs), "answer_weight": str(args.answer_weight),
                    "training_accuracy": f"{trained:.4f}", "held_out_accuracy": f"{held_out:.4f}"})
    print(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB, {time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
