"""Does decoding several requests in one forward pay on this machine? One forward, batch 1 vs B.

Serving concurrent requests one after another costs ``B`` forwards; a batched decoder would run
one forward over ``B`` sequences instead (the weights are read once). This times exactly that
trade on the default model with the lean forward's own weights and products (oneDNN on a CPU in
fp32): a forward over ``B`` sequences of ``rows`` new positions each, after ``context`` cached
positions, against ``B`` forwards over one sequence. ``rows=1`` is plain decoding; ``rows=5``
is a speculative verify step (the pending token and four drafted ones), which already uses the
extra rows that batching would add. The sequences are all the same length (the best case for
batching: no padding). Shapes are interleaved and each is timed ``--repeat`` times; the table
reports the fastest run, the measure least disturbed by other processes on a shared machine.

``--clock cpu`` times the CPU time of one thread (``time.thread_time``, torch on one thread)
instead of the wall clock: on a machine that other processes keep busy, wall-clock times of a
2-thread forward swing by several times, while the work a forward does stays what it is.

    python benchmarks/batch_forward.py [--context 512] [--batches 1 2 4 8] [--rows 1 5] [--repeat 15] [--clock wall|cpu]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ragspec.backends.pytorch.forward import LlamaForward  # noqa: E402
from ragspec.backends import load_model  # noqa: E402


def _torch_backend() -> dict[str, str]:
    """``backend="torch"`` where ``load_model`` has a choice of back ends (the lean forward needs torch weights)."""
    import inspect

    return {"backend": "torch"} if "backend" in inspect.signature(load_model).parameters else {}


class BatchedStep:
    """The lean Llama forward over ``[batch, rows]`` new positions after ``context`` cached ones."""

    def __init__(self, fw: LlamaForward, batch: int, rows: int, context: int) -> None:
        self.fw, self.batch, self.rows, self.context = fw, batch, rows, context
        attn = fw.layers[0].self_attn
        kv_heads = fw.config.num_key_value_heads
        shape = (batch, kv_heads, context + rows, fw.head_dim)
        torch.manual_seed(0)
        self.keys = [torch.randn(shape) for _ in fw.layers]
        self.values = [torch.randn(shape) for _ in fw.layers]
        self.heads = attn.config.num_attention_heads
        n = rows
        self.mask = None if n == 1 else torch.ones(n, context + n, dtype=torch.bool).tril(context)
        self.ids = torch.randint(0, fw.embed.shape[0], (batch, rows))

    @torch.inference_mode()
    def __call__(self) -> torch.Tensor:
        fw, b, n, past, hd = self.fw, self.batch, self.rows, self.context, self.fw.head_dim
        # The products the forward itself runs for this many rows (its kernel per row count, ``step_products``).
        _, kernel, weights, head = next(p for p in reversed(fw.step_products) if p[0] <= b * n)
        lin = kernel.linear
        x = F.embedding(self.ids.reshape(-1), fw.embed)  # [b * n, hidden]
        cos, sin = fw.cos[past : past + n], fw.sin[past : past + n]
        for i, (w, (qkv, gate_up)) in enumerate(zip(weights, fw.fused)):
            h = fw._norm(x, w.input_norm)
            q, k, v = (t.view(b, n, -1, hd).transpose(1, 2) for t in lin(h, w.qkv, w.qkv_bias).split(qkv.sizes, -1))
            keys, values = self.keys[i], self.values[i]
            keys[:, :, past:].copy_(fw._rotate(k, cos, sin))  # write the new positions, as the cache does
            values[:, :, past:].copy_(v)
            a = F.scaled_dot_product_attention(
                fw._rotate(q, cos, sin), keys, values, attn_mask=self.mask, scale=fw.scale, enable_gqa=True
            )  # [b, heads, n, hd]
            x = x + lin(a.transpose(1, 2).reshape(b * n, -1), w.o, w.o_bias)
            h = fw._norm(x, w.post_norm)
            gate, up = lin(h, w.gate_up, w.gate_up_bias).split(gate_up.sizes, -1)
            x = x + lin(F.silu(gate) * up, w.down, w.down_bias)
        return lin(fw._norm(x, fw.norm.weight), head, None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--context", type=int, default=512, help="cached positions per sequence (default: 512)")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 5], help="new positions per sequence (default: 1 5)")
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="wall clock, or the CPU time of one thread (torch then runs on one thread)")
    args = parser.parse_args(argv)
    if args.clock == "cpu":
        torch.set_num_threads(1)
    elif args.threads:
        torch.set_num_threads(args.threads)
    clock = time.thread_time if args.clock == "cpu" else time.perf_counter

    lm = load_model("default", device="cpu", dtype="float32", **_torch_backend())
    fw = LlamaForward(lm.model, lm.device, lm.dtype)
    steps = {(b, r): BatchedStep(fw, b, r, args.context) for r in args.rows for b in args.batches}
    for step in steps.values():  # first runs of a shape pay one-off set-up
        step()
        step()
    times: dict[tuple[int, int], list[float]] = {key: [] for key in steps}
    for _ in range(args.repeat):
        for key, step in steps.items():  # interleaved, so a burst of load elsewhere hits every shape
            start = clock()
            step()
            times[key].append(clock() - start)

    what = "CPU time of one thread" if args.clock == "cpu" else f"wall clock, {torch.get_num_threads()} threads"
    print(f"{lm.name}, fp32, {fw.description}, {what}, {args.context} cached positions, fastest of {args.repeat}")
    print("| rows/seq | batch | one forward (ms, min / median) | per sequence (ms) | batch-1 forwards for the same work (ms) | throughput gain |")
    print("|---|---|---|---|---|---|")
    for r in args.rows:
        base = min(times[(1, r)]) if (1, r) in times else None
        for b in args.batches:
            best, median = min(times[(b, r)]), statistics.median(times[(b, r)])
            serial = base * b if base is not None else float("nan")
            print(
                f"| {r} | {b} | {best * 1e3:.1f} / {median * 1e3:.1f} | {best * 1e3 / b:.1f} | "
                f"{serial * 1e3:.1f} | {serial / best:.2f}x |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
