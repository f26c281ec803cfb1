"""The decode loop, above the engine's pure parts (``ragspec.engine``) and the back ends (``ragspec.backends``).

``generator`` (``SpeculativeGenerator``: a target model's back end, its KV cache and the verify
loop), ``model_drafter`` (a small draft model behind the ``Drafter`` seam) and ``calibration``
(verify costs timed once per model and machine). Importing this package imports none of its modules.
"""
