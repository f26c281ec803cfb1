"""How often the draft head guesses plain decoding's next token, in the loop and in one forward over the answer.

For each question (the pipeline's prompt over hybrid retrieval's top 3 passages, as ``benchmarks/bench.py``
builds it) the default model decodes greedily, one step at a time, and at every step the bundled draft head
(``ragspec.decoding.draft_head``) guesses the token after the newest one from the hidden state the back end kept
(``TorchBackend.hidden_at``), as ``HeadDrafter`` does. The same guesses are then made from one transformers
forward over the prompt and the whole answer (how ``benchmarks/train_draft_head.py`` computes its pairs), so the
two shares say whether the loop's hidden states are the ones the head was trained on. No timing; a minute or two:

    python benchmarks/head_accuracy.py [--questions 16] [--max-new-tokens 60] [--dtype auto|float32] [--question-set FILE ...]
        [--head FILE]

Without ``--question-set`` the questions are the unseen-style sets of issue 35 (``heldout_questions.json`` and
``fresh_questions.json``), which the head was not trained on.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_workload import retrieved_questions  # noqa: E402

from ragspec.backends import load_model  # noqa: E402
from ragspec.backends.pytorch import TorchBackend  # noqa: E402
from ragspec.decoding.draft_head import DraftHead, head_path  # noqa: E402
from ragspec.prompts import qa_prompt_ids  # noqa: E402

DATA = Path(__file__).resolve().parent / "data"
UNSEEN = (DATA / "heldout_questions.json", DATA / "fresh_questions.json")


@torch.inference_mode()
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=60)
    parser.add_argument("--dtype", default="auto", help="the generator's dtype setting (default: auto)")
    parser.add_argument("--question-set", action="append", type=Path, default=[], metavar="FILE")
    parser.add_argument("--head", type=Path, default=None, help="a head file (default: the package's head of the model)")
    args = parser.parse_args(argv)
    lm = load_model("default", device="cpu", dtype=args.dtype, backend="torch")
    backend = TorchBackend(lm)
    model = lm.model
    head = DraftHead.load(args.head or head_path(lm.name), model.get_input_embeddings().weight.detach(),
                          model.get_output_embeddings().weight.detach())
    in_loop = [0, 0]  # right, guesses
    one_forward = [0, 0]
    for question, passages in retrieved_questions(args.questions, 3, args.question_set or UNSEEN):
        prompt = qa_prompt_ids(lm.tokenizer, question["question"], passages)
        cache = backend.new_cache(len(prompt) + args.max_new_tokens + 1)
        context = prompt + [int(backend.forward(prompt, cache, last_only=True)[-1].argmax())]
        while len(context) - len(prompt) < args.max_new_tokens and context[-1] not in backend.eos_token_ids:
            guess = head.guess(backend.hidden_at(len(context) - 2), context[-1])
            chosen = int(backend.forward([context[-1]], cache)[-1].argmax())
            in_loop[0] += guess == chosen
            in_loop[1] += 1
            context.append(chosen)
        out = model(torch.tensor([context]), output_hidden_states=True)
        hidden = out.hidden_states[-1][0].to(lm.dtype)  # after the final norm
        for t in range(len(prompt) - 1, len(context) - 2):
            one_forward[0] += head.guess(hidden[t], context[t + 1]) == int(out.logits[0, t + 1].argmax())
            one_forward[1] += 1
    print(f"{lm.name}, {backend.description}, {args.questions} questions")
    print(f"in the loop: {in_loop[0]}/{in_loop[1]} right ({in_loop[0] / max(in_loop[1], 1):.3f})")
    print(f"one forward over prompt and answer: {one_forward[0]}/{one_forward[1]} right "
          f"({one_forward[0] / max(one_forward[1], 1):.3f})")
    print(f"the head's held-out accuracy in training: {head.metadata.get('held_out_accuracy', 'unknown')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
