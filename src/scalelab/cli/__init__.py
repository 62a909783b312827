"""Thin Hydra/argparse entry points: scalelab-train, -sample, -export (and -data, -sweep, -fit).

The config they compose (schema, validation, compose) lives one layer down, in
``scalelab.config``; each Hydra entry point calls ``scalelab.config.schema.register()`` first.
Importing them changes nothing in the process: a run applies its CPU settings when it starts.
"""
