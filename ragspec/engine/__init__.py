"""The decoding engine: the verify loop (``generator``), its drafters (``drafting``, ``ngram``,
``model_drafter``), the drafting ``policy`` and its ``calibration``, acceptance (``sampling``),
``penalties``, ``constraints`` and ``tool_calls``, the ``prefix_cache`` and the stop-text helpers
(``text``).

Its torch-free part is what a remote generator shares with the local one: ``config``
(``GenerationConfig``: every option's one way in), ``results`` (results, statistics, the stream,
errors, the ``Generator`` protocol) and ``cancel``. Importing this package imports none of its
modules, so ``ragspec.engine.config`` stays as light as it is.
"""
