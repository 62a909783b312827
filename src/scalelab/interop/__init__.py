"""Interoperability with Hugging Face transformers: export, import, tokenizer conversion.

model/ stays torch-only; this package maps our state_dict keys to HF's and back.
"""
