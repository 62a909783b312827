"""Moved to ``scalelab.data.files``. This alias lasts until cli/ and scaling/run.py import the
new module (their owners edit those lines); then delete this file."""

from scalelab.data.files import (  # noqa: F401
    atomic_open,
    atomic_save_with,
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_text,
    fsync_dir,
    locked,
    temp_path_for,
)
