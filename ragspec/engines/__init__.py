"""Engines other than ragspec's own that run ragspec's drafting: vLLM (``ragspec.engines.vllm``).

``ragspec.engines.vllm`` is imported inside vLLM's worker process, in vLLM's own environment, so
it and what it imports (``ragspec.ngram``, ``ragspec.policy``, ``ragspec.drafting``) need only the
standard library, numpy and torch; ``ragspec.engines.vllm_server`` runs on ragspec's side and
starts that server.
"""
