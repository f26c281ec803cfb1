"""vLLM as a back end: ragspec's drafting inside vLLM's engine (``ragspec.backends.vllm.proposer``;
with a draft model, the hybrid: ``ragspec.backends.vllm.hybrid`` decides, ``ragspec.backends.vllm.hybrid_worker``
puts it inside vLLM's draft-model proposer) and the server that runs it (``ragspec.backends.vllm.server``;
the draft model's folder: ``ragspec.backends.vllm.draft``).

The proposers are imported inside vLLM's worker process, in vLLM's own environment, so they and what
they import (this package's parents, ``ragspec.engine.ngram``, ``ragspec.engine.policy``,
``ragspec.engine.drafting``) need only the standard library, numpy, torch and transformers (and
vLLM, for ``hybrid_worker``); ``ragspec.backends.vllm.server`` and ``draft`` run on ragspec's side.
"""
