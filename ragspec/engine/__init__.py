"""The decoding engine's pure parts, under the back ends and the decode loop (``ragspec.decoding``).

Drafting (``drafting``: the ``Drafter`` seam and ``Draft``; ``ngram``, ``ngram_batch``), the drafting
``policy`` and its ``planning`` (one cost curve, one best-k search), acceptance (``sampling``),
``penalties``, ``constraints`` and ``tool_calls``, the ``prefix_cache``, the stop-text helpers
(``text``), request scopes (``tenancy``) and ``cancel``. Nothing here runs a model: this package
imports neither ``ragspec.backends`` nor ``ragspec.decoding``.

Its torch-free part is what a remote generator shares with the local one: ``config``
(``GenerationConfig``: every option's one way in), ``results`` (results, statistics, the stream,
errors, the ``TextGenerator`` protocol) and ``cancel``. Importing this package imports none of its
modules, so ``ragspec.engine.config`` stays as light as it is.
"""
