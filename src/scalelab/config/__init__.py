"""The composed run config, below cli/ and scaling/ (imports neither).

- ``schema``: the typed shape of conf/train.yaml; ``register()`` stores it and the
  ``scalelab.*`` resolvers (call it before composing; idempotent);
- ``run_dir``: which run folder a command uses (the ``${scalelab.run_dir:...}`` resolver);
- ``spec``: ``build_spec(cfg)`` validates a composed config into a typed ``RunSpec``;
- ``compose``: ``compose("train", overrides)`` in-process (sweeps, tests);
- ``counts``: ``5e6``-style counts as whole numbers.

Submodules are imported by name (``from scalelab.config.spec import build_spec``) so that
importing this package costs nothing.
"""
