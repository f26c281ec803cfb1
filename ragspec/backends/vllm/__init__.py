"""vLLM as a back end: ragspec's drafting inside vLLM's engine (``ragspec.backends.vllm.proposer``)
and the server that runs it (``ragspec.backends.vllm.server``).

The proposer is imported inside vLLM's worker process, in vLLM's own environment, so it and what
it imports (this package's parents, ``ragspec.engine.ngram``, ``ragspec.engine.policy``,
``ragspec.engine.drafting``) need only the standard library, numpy, torch and transformers;
``ragspec.backends.vllm.server`` runs on ragspec's side and starts that server.
"""
