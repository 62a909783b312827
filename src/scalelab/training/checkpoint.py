"""The checkpoint format, in one place: how a checkpoint is written, read, verified and chosen.

- Writing (``write_checkpoint``; ``checkpoint_io.VerifiedCheckpointIO`` gives it to the Trainer
  as a plugin, so ModelCheckpoint, StepCheckpoints and ``trainer.save_checkpoint`` all use it):
  a temp file in the destination folder, fsync, the old sidecar removed, rename, then a
  ``<name>.sha256`` sidecar holding size and SHA-256 (a kill at any point leaves a pair that
  verifies or a file that loads). Lightning's own writer stages the file in $TMPDIR and moves
  it, which across filesystems is a plain copy that a full disk leaves truncated under the
  final name.
- Reading (``read_checkpoint``): always ``torch.load(weights_only=True)``, passed explicitly so
  TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD cannot turn it off; a broken file is one ``CheckpointError``
  line naming the file and the fix, never torch's advice to load with weights_only=False.
- Verifying (``verify``): the sidecar's size and hash; a file without a sidecar (older runs,
  FSDP consolidation) must load.
- Choosing (``newest_verified``): resume takes last.ckpt, else the newest step_<N>.ckpt or
  best.ckpt that verifies, and reports the ones it skipped.
- Matching (``check_compatible``): the checkpoint's model shape, objective and tokenizer against
  the run about to use it, before any run folder or MLflow run is touched.
- The keys scalelab adds to Lightning's dict (``STATE_KEY``, ``RUN_KEY``, ``RNG_KEY``), who
  writes them (``module_state``, ``add_run_meta``, ``add_rng_state``) and how they read back
  (``model_config``, ``run_meta``, ``restore_rng_state``, ``load_model``). The model config is
  stored once, in Lightning's ``hyper_parameters["model_cfg"]`` (``RUN_KEY["model_config"]``
  only where there are no hyper_parameters: imported models). Checkpoints written before that
  stored it three times; they read the same.
- FSDP: a sharded folder read without unpickling arbitrary objects, and consolidated into one
  plain file (``consolidate_checkpoint``, ``consolidated_if_sharded``).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import itertools
import os
import pickle
import random
import warnings
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from scalelab.data.files import atomic_write_json, fsync_dir, temp_path_for

SIDECAR_SUFFIX = ".sha256"
HPARAMS_KEY = "hyper_parameters"  # Lightning's: the module's arguments, "model_cfg" among them
STATE_KEY = "scalelab"  # the module's counters: objective, tokens_seen, flops_seen
RUN_KEY = "scalelab_run"  # the run: objective, tokenizer spec, block_size, data, MLflow run id
RNG_KEY = "scalelab_rng"  # torch / cuda / numpy / python RNG states, restored on resume
# ModelConfig keys that change how weights are initialised or regularised, or how attention is
# computed, not their shapes: a checkpoint trained with other values still continues correctly.
_NOT_SHAPE_KEYS = frozenset({"dropout", "init_std", "scale_residual_init", "attention"})
_HASH_CHUNK = 1 << 20


class CheckpointError(ValueError):
    """A checkpoint that cannot be used: one line naming the file and what to do."""


class CheckpointWriteError(OSError):
    """Writing a checkpoint failed (typically a full disk); the message names the path."""

    def __str__(self) -> str:  # the message alone, without OSError's "[Errno 28]" prefix
        return str(self.strerror)


# --- writing ------------------------------------------------------------------------------------
def sidecar_path(path: Path) -> Path:
    return path.with_name(path.name + SIDECAR_SUFFIX)


def file_digest(path: Path) -> tuple[int, str]:
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            h.update(chunk)
            size += len(chunk)
    return size, h.hexdigest()


def _drop_sidecar(path: Path) -> None:
    """Remove ``path``'s sidecar before a new file takes its name. A process killed between the
    rename and the new sidecar would otherwise leave the new checkpoint beside the old one's
    hash: a whole file that fails to verify, so resume found "no usable checkpoint" (a sweep
    SIGKILLed mid-save). Without a sidecar, ``verify`` loads the file instead."""
    try:
        sidecar_path(path).unlink()
    except FileNotFoundError:
        return
    fsync_dir(path.parent)  # gone on disk before the rename is


def write_checkpoint(checkpoint: Mapping[str, Any], path: str | Path) -> None:
    """Write ``checkpoint`` to ``path`` atomically, with its size/hash sidecar."""
    path = Path(path)
    tmp = temp_path_for(path)
    # Serialized in memory first (as Lightning does): torch's zip writer turns a full disk into
    # "unexpected pos"; plain file writes raise OSError(ENOSPC), which names the problem.
    buf = io.BytesIO()
    torch.save(dict(checkpoint), buf)
    data = buf.getbuffer()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        _drop_sidecar(path)
        os.replace(tmp, path)
        fsync_dir(path.parent)
        atomic_write_json(sidecar_path(path), {"size": len(data),
                                               "sha256": hashlib.sha256(data).hexdigest()})
    except OSError as e:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise _write_error(path, e) from e
    finally:
        data.release()


def _write_error(path: Path, e: OSError) -> CheckpointWriteError:
    why = e.strerror or str(e)
    fix = ("free space on that disk or point paths.log_dir/paths.output_dir at a larger one"
           if e.errno in (errno.ENOSPC, errno.EDQUOT) else "check that the folder is writable")
    return CheckpointWriteError(e.errno or errno.EIO,
                                f"could not write checkpoint {path}: {why}; {fix}")


# --- reading ------------------------------------------------------------------------------------
def _load_failure(path: Path, e: BaseException) -> CheckpointError:
    if isinstance(e, pickle.UnpicklingError) and "GLOBAL" in str(e):
        why = "it holds pickled objects other than tensors and plain data (refused: they could run code)"
    elif isinstance(e, pickle.UnpicklingError):
        why = "it is not a torch checkpoint"
    elif isinstance(e, (EOFError, zipfile.BadZipFile)) or "central directory" in str(e) \
            or "zip archive" in str(e):
        why = "it is truncated or not a torch checkpoint"
    else:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        why = first[:160] if "weights_only" not in first else "torch could not read it"
    return CheckpointError(f"{path}: not a usable checkpoint ({why}); pass another checkpoint "
                           "(e.g. checkpoints/best.ckpt or a step_<N>.ckpt) or train again")


def _load_plain(path: Path, map_location: Any = "cpu") -> Any:
    """``torch.load(weights_only=True)`` of one file; ``CheckpointError`` if it cannot be read.

    torch warns about what it meets in unreadable bytes (e.g. "pickle protocol 175"): the
    warnings are kept back until the load succeeds, so a bad file gives our one line only.
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            obj = torch.load(path, map_location=map_location, weights_only=True)
        except (RuntimeError, EOFError, pickle.UnpicklingError, zipfile.BadZipFile, ValueError,
                KeyError, AttributeError, IndexError, TypeError) as e:
            raise _load_failure(path, e) from None
        except OSError as e:
            if e.errno != errno.EINVAL:  # EINVAL: torch seeking past the end of a truncated file
                raise
            raise _load_failure(path, EOFError()) from None
    for w in caught:
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return obj


def read_checkpoint(path: str | Path, map_location: Any = "cpu") -> dict[str, Any]:
    """The checkpoint dict (plain data only); ``CheckpointError`` if it is not usable."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such checkpoint file")
    ckpt = _load_plain(path, map_location)
    if not isinstance(ckpt, dict) or "state_dict" not in ckpt:
        raise CheckpointError(f"{path}: not a Lightning checkpoint (no state_dict); pass a "
                              "checkpoint that scalelab-train wrote (<run folder>/checkpoints/*.ckpt)")
    return ckpt


def read_meta(path: str | Path) -> dict[str, Any]:
    """What scalelab-train stored about the run (model config, objective, tokenizer, step).

    An FSDP sharded folder keeps it in ``meta.pt`` next to the shards; read it with
    weights_only=True too, never the shards' pickled metadata.
    """
    path = Path(path)
    if path.is_dir():
        meta_file = path / "meta.pt"
        if not meta_file.is_file():
            raise CheckpointError(f"{path}: a checkpoint folder without meta.pt; pass a .ckpt file")
        extra = _load_plain(meta_file)
        if not isinstance(extra, dict):
            raise CheckpointError(f"{meta_file}: not checkpoint metadata")
        ckpt = extra
    else:
        ckpt = read_checkpoint(path)
    meta = run_meta(ckpt)
    meta["global_step"] = int(ckpt.get("global_step", 0))
    return meta


# --- the keys scalelab adds, written and read here only ------------------------------------
def module_state(objective: str, tokens_seen: int, flops_seen: float) -> dict[str, Any]:
    """``checkpoint[STATE_KEY]``: what the LightningModule restores on resume."""
    return {"objective": objective, "tokens_seen": int(tokens_seen), "flops_seen": float(flops_seen)}


def read_module_state(checkpoint: Mapping[str, Any]) -> tuple[int, float]:
    """(tokens_seen, flops_seen) of a checkpoint (0 for one without them)."""
    state = checkpoint.get(STATE_KEY) or {}
    return int(state.get("tokens_seen", 0)), float(state.get("flops_seen", 0.0))


def add_run_meta(checkpoint: dict[str, Any], meta: Mapping[str, Any]) -> None:
    """Store the run's plain-data ``meta`` under ``RUN_KEY``; its model config only where
    Lightning's hyper_parameters do not already hold it (the config is stored once)."""
    run = dict(meta)
    if (checkpoint.get(HPARAMS_KEY) or {}).get("model_cfg"):
        run.pop("model_config", None)
    checkpoint[RUN_KEY] = run


def model_config(checkpoint: Mapping[str, Any]) -> dict[str, Any] | None:
    """The ModelConfig dict a checkpoint carries (None if it has none)."""
    found = ((checkpoint.get(HPARAMS_KEY) or {}).get("model_cfg")
             or (checkpoint.get(RUN_KEY) or {}).get("model_config")
             or (checkpoint.get(STATE_KEY) or {}).get("model_cfg"))  # the old third copy
    return dict(found) if found else None


def run_meta(checkpoint: Mapping[str, Any]) -> dict[str, Any]:
    """What scalelab-train stored about the run, with ``model_config`` filled in."""
    meta = dict(checkpoint.get(RUN_KEY) or {})
    cfg = model_config(checkpoint)
    if cfg:
        meta["model_config"] = cfg
    return meta


def model_state_dict(checkpoint: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """The Transformer's own weights (the LightningModule's ``model.`` prefix removed)."""
    sd = checkpoint["state_dict"]
    out = {k[len("model."):]: v for k, v in sd.items() if k.startswith("model.")}
    return out or dict(sd)


def load_model(path: str | Path) -> Any:
    """The Transformer of a checkpoint file (weights only: no pickled code runs)."""
    ckpt = read_checkpoint(path)
    cfg = model_config(ckpt)
    if not cfg:
        raise CheckpointError(f"{path}: no model config in the checkpoint (not from scalelab-train?)")
    return model_of(cfg, model_state_dict(ckpt), path)


def model_of(cfg: Mapping[str, Any], weights: Mapping[str, torch.Tensor], path: str | Path) -> Any:
    """A Transformer built from a checkpoint's stored config and loaded with its weights; a file
    whose tensors no longer fit that config (edited, or from another model version) is one
    CheckpointError naming the first differences, never torch's multi-line load error."""
    from scalelab.model import ModelConfig, Transformer

    model = Transformer(ModelConfig.from_dict(dict(cfg)))
    own = model.state_dict()
    missing = sorted(set(own) - set(weights))
    unexpected = sorted(set(weights) - set(own))
    if missing or unexpected:
        raise CheckpointError(
            f"{path}: its weights do not fit its model config ({len(missing)} missing, e.g. "
            f"{(missing or ['-'])[0]}; {len(unexpected)} unexpected, e.g. {(unexpected or ['-'])[0]}): "
            "it was written by another version of the model; export it with that version")
    wrong = [k for k in own if tuple(own[k].shape) != tuple(getattr(weights[k], "shape", ()))]
    if wrong:
        k = wrong[0]
        raise CheckpointError(
            f"{path}: {len(wrong)} tensor(s) do not match the model config stored with them, e.g. "
            f"{k} is {list(getattr(weights[k], 'shape', []))} where the config "
            f"[{describe_model(cfg)}] needs {list(own[k].shape)}: the file was altered; use "
            "another checkpoint")
    model.load_state_dict(dict(weights))
    return model


def add_rng_state(checkpoint: dict[str, Any]) -> None:
    """Store the RNG states as plain tensors/lists, so dropout and masking continue the same
    random stream on resume and the file still loads with weights_only=True."""
    np_state = np.random.get_state()
    version, state, gauss = random.getstate()
    checkpoint[RNG_KEY] = {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": [str(np_state[0]), torch.from_numpy(np_state[1].astype(np.int64)),
                  int(np_state[2]), int(np_state[3]), float(np_state[4])],
        "python": [version, list(state), gauss],
    }


def restore_rng_state(checkpoint: Mapping[str, Any]) -> None:
    """Undo ``add_rng_state`` (no-op for a checkpoint without RNG states)."""
    rng = checkpoint.get(RNG_KEY)
    if not rng:
        return
    torch.set_rng_state(rng["torch"])
    if rng.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
    name, keys, pos, has_gauss, cached = rng["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    version, state, gauss = rng["python"]
    random.setstate((version, tuple(state), gauss))


# --- verifying and choosing -----------------------------------------------------------------
def verify(path: str | Path) -> str | None:
    """None if ``path`` is a complete checkpoint, else why not (one short phrase)."""
    path = Path(path)
    if path.is_dir():
        if not (path / ".metadata").is_file():
            return "a folder without FSDP .metadata"
        try:  # the shard index must be made of checkpoint classes only (see _MetadataUnpickler)
            with open(path / ".metadata", "rb") as f:
                _MetadataUnpickler(f).load()
        except (pickle.UnpicklingError, EOFError, ValueError, AttributeError, ImportError) as e:
            return f"its .metadata is unusable ({str(e).splitlines()[0][:120] if str(e) else 'truncated'})"
        return None
    if not path.is_file():
        return "missing"
    side = sidecar_path(path)
    if side.is_file():
        import json

        try:
            want = json.loads(side.read_text())
            size_want, hash_want = int(want["size"]), str(want["sha256"])
        except (OSError, ValueError, KeyError, TypeError):
            return f"its sidecar {side.name} is unreadable"
        size = path.stat().st_size
        if size != size_want:  # cheap first: a full disk leaves a short file
            return f"truncated or changed: {size:,} of {size_want:,} bytes"
        return None if file_digest(path)[1] == hash_want else "its SHA-256 does not match its sidecar"
    try:  # no sidecar (written before sidecars, or by hand): it must at least load
        read_checkpoint(path)
    except CheckpointError as e:
        return str(e).split(": ", 1)[-1].split("; ", 1)[0]
    return None


def _step_of(path: Path) -> int:
    stem = path.stem
    return int(stem.split("_", 1)[1]) if stem.startswith("step_") and stem[5:].isdigit() else -1


def candidates(ckpt_dir: Path) -> list[Path]:
    """last.ckpt first, then step_<N>.ckpt and best.ckpt, newest first."""
    others = [p for p in ckpt_dir.glob("*.ckpt") if p.name != "last.ckpt"
              and not p.name.endswith(".consolidated.ckpt") and not p.name.startswith(".")]
    others.sort(key=lambda p: (p.stat().st_mtime, _step_of(p)), reverse=True)
    last = ckpt_dir / "last.ckpt"
    return ([last] if last.exists() else []) + others


def newest_verified(ckpt_dir: str | Path,
                    check: Callable[[Path], str | None] = verify,
                    ) -> tuple[Path | None, list[tuple[Path, str]]]:
    """The newest checkpoint in ``ckpt_dir`` that verifies, and (path, why) for those skipped."""
    skipped: list[tuple[Path, str]] = []
    d = Path(ckpt_dir)
    if not d.is_dir():
        return None, skipped
    for cand in candidates(d):
        why = check(cand)
        if why is None:
            return cand, skipped
        skipped.append((cand, why))
    return None, skipped


# --- matching the run about to use it ----------------------------------------------------------
def describe_model(model_config: Mapping[str, Any]) -> str:
    """A short shape line, e.g. ``decoder d_model=64 n_layers=2 n_heads=4 vocab=65 seq=64``."""
    m = model_config
    parts = [str(m.get("arch", "?")), f"d_model={m.get('d_model')}", f"n_layers={m.get('n_layers')}",
             f"n_heads={m.get('n_heads')}", f"vocab={m.get('vocab_size')}", f"seq={m.get('max_seq_len')}"]
    return " ".join(parts)


def _tokenizer_identity(spec: Mapping[str, Any]) -> dict[str, Any]:
    # the prepared folder's location may move between machines; name/vocab may not
    return {k: v for k, v in spec.items() if k not in ("dir", "kind")}


def check_compatible(key: str, path: Path, meta: Mapping[str, Any], *,
                     model_config: Mapping[str, Any], objective: str,
                     tokenizer: Mapping[str, Any]) -> None:
    """Raise CheckpointError naming both sides if ``path`` cannot continue this run."""
    saved = meta.get("model_config")
    if not saved:
        raise CheckpointError(f"{key}={path}: no scalelab run metadata in it (not written by "
                              "scalelab-train); pass a checkpoint from <run folder>/checkpoints/")
    diff = sorted(k for k in set(saved) | set(model_config)
                  if k not in _NOT_SHAPE_KEYS and saved.get(k) != model_config.get(k))
    if diff:
        detail = ", ".join(f"{k} {saved.get(k)!r} vs {model_config.get(k)!r}" for k in diff[:6])
        raise CheckpointError(
            f"{key}={path} holds a model of shape [{describe_model(saved)}] but this run builds "
            f"[{describe_model(model_config)}] ({detail}); use the model/tokenizer overrides of the "
            "run that wrote it, or another checkpoint")
    if meta.get("objective") and meta["objective"] != objective:
        raise CheckpointError(f"{key}={path} was trained with objective={meta['objective']}, this "
                              f"run uses objective={objective}; pick a matching checkpoint")
    saved_tok = meta.get("tokenizer")
    if saved_tok and _tokenizer_identity(saved_tok) != _tokenizer_identity(tokenizer):
        raise CheckpointError(
            f"{key}={path} was trained with tokenizer {saved_tok.get('name')!r} "
            f"(vocab {saved_tok.get('vocab_size', saved.get('vocab_size'))}), this run uses "
            f"{tokenizer.get('name')!r}; use the same tokenizer= and data= as that run")


# --- FSDP sharded folders, read without unpickling arbitrary objects ----------------------------
_DCP_MODULES = ("torch.distributed.checkpoint.metadata", "torch.distributed.checkpoint.filesystem",
                "torch.distributed.checkpoint.planner")
_SAFE_GLOBALS = {("torch", "Size"), ("torch.serialization", "_get_layout"),
                 ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"),
                 ("collections", "OrderedDict"), ("builtins", "set"), ("builtins", "frozenset"),
                 ("builtins", "slice")}


class _MetadataUnpickler(pickle.Unpickler):
    """torch.distributed.checkpoint's ``.metadata`` is a raw pickle (its reader calls
    ``pickle.load``): allow only the classes that file is made of, so a crafted folder cannot
    run code even with TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1."""

    def find_class(self, module: str, name: str) -> Any:
        import importlib

        if module in _DCP_MODULES:
            obj = getattr(importlib.import_module(module), name, None)
            if isinstance(obj, type) and obj.__module__ == module:
                return obj
        elif module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        elif (module, name) in _SAFE_GLOBALS:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not allowed in checkpoint metadata")


def _safe_reader(folder: Path) -> Any:
    from torch.distributed.checkpoint import FileSystemReader

    class SafeReader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            from torch.distributed.checkpoint.metadata import StorageMeta

            with open(Path(self.path) / ".metadata", "rb") as f:
                metadata = _MetadataUnpickler(f).load()
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return SafeReader(folder)


def _safe_planner() -> Any:
    from torch.distributed.checkpoint import DefaultLoadPlanner

    class SafePlanner(DefaultLoadPlanner):
        """Loads the non-tensor items with ``weights_only=True`` (the default planner unpickles
        them freely). The target dict is flat and holds plain tensors, so it is used as given:
        no key mapping, no sharded-tensor rewrite."""

        def __init__(self) -> None:
            super().__init__(flatten_state_dict=False, flatten_sharded_tensors=False)

        def load_bytes(self, read_item: Any, value: Any) -> None:
            fqn = read_item.dest_index.fqn
            self.original_state_dict[fqn] = torch.load(value, map_location="cpu", weights_only=True)

    return SafePlanner()


def _empty_targets(metadata: Any) -> dict[str, Any]:
    """One entry per stored item, keyed by its flat name: an empty full-size CPU tensor to read
    a tensor's shards into, None for a pickled item (the planner reads those)."""
    from torch.distributed.checkpoint import TensorStorageMetadata

    return {fqn: torch.empty(md.size, dtype=md.properties.dtype)
            if isinstance(md, TensorStorageMetadata) else None
            for fqn, md in metadata.state_dict_metadata.items()}


def _nest(flat: Mapping[str, Any], paths: Mapping[str, tuple[str | int, ...]] | None) -> dict[str, Any]:
    """Rebuild the nested dict the writer flattened: ``paths`` (the metadata's planner_data) maps
    each flat name to its key path; an int key is a list index (optimizer param_groups)."""
    root: dict[str, Any] = {}
    for fqn, value in flat.items():
        path = tuple(paths[fqn]) if paths and fqn in paths else (fqn,)
        node: Any = root
        for key, child in itertools.pairwise(path):
            fresh: Any = [] if isinstance(child, int) else {}
            if isinstance(node, list):
                node.extend([None] * (key + 1 - len(node)))
                node[key] = fresh if node[key] is None else node[key]
            else:
                node.setdefault(key, fresh)
            node = node[key]
        if isinstance(node, list):
            node.extend([None] * (path[-1] + 1 - len(node)))
        node[path[-1]] = value
    return root


def read_sharded(folder: str | Path) -> dict[str, Any]:
    """A sharded FSDP checkpoint folder as one Lightning checkpoint dict (plain data only)."""
    import torch.distributed.checkpoint as dcp

    folder = Path(folder)
    why = verify(folder)  # the shard index, with the restricted unpickler, before torch reads it
    if why:
        raise CheckpointError(f"{folder}: not a usable checkpoint ({why}); pass another checkpoint")
    try:
        reader = _safe_reader(folder)
        metadata = reader.read_metadata()
        flat = _empty_targets(metadata)
        with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
            warnings.filterwarnings("ignore", message=".*load in a single process")
            dcp.load(flat, storage_reader=reader, planner=_safe_planner(), no_dist=True)
        checkpoint = _nest(flat, metadata.planner_data)
        meta_file = folder / "meta.pt"  # Lightning's non-tensor rest (step, loops, callbacks)
        if meta_file.is_file():
            checkpoint.update(torch.load(meta_file, map_location="cpu", weights_only=True))
    except Exception as e:  # torch wraps per-rank failures in CheckpointException
        if isinstance(e, OSError) and not isinstance(e, FileNotFoundError):
            raise
        raise _load_failure(folder, e) from None
    # Lightning's layout -> a single-device checkpoint (pytorch_lightning consolidate_checkpoint)
    checkpoint["state_dict"] = checkpoint.pop("model")
    opt_keys = sorted(k for k in checkpoint if k.startswith("optimizer_") and k[10:].isdigit())
    if opt_keys:
        checkpoint["optimizer_states"] = [checkpoint.pop(f"optimizer_{i}") for i in range(len(opt_keys))]
    return checkpoint


def is_sharded_checkpoint(path: str | Path) -> bool:
    """A folder written by FSDP with state_dict_type=sharded (torch.distributed.checkpoint)."""
    p = Path(path)
    return p.is_dir() and (p / ".metadata").is_file()


def consolidate_checkpoint(sharded: str | Path, output: str | Path | None = None) -> Path:
    """Merge a sharded FSDP checkpoint folder into one ordinary Lightning ``.ckpt`` file.

    Same as ``python -m pytorch_lightning.utilities.consolidate_checkpoint DIR``: the result has
    ``state_dict`` and ``optimizer_states`` like a single-device checkpoint, so sampling and
    export load it with ``torch.load(weights_only=True)`` and a non-FSDP run can resume from it.
    Runs on CPU in one process. Default output: ``<folder>.consolidated.ckpt`` next to it.
    """
    src = Path(sharded)
    if not is_sharded_checkpoint(src):
        raise FileNotFoundError(
            f"{src} is not a sharded checkpoint folder (no .metadata inside); pass the folder "
            "that trainer.strategy=fsdp with trainer.fsdp.state_dict_type=sharded wrote"
        )
    out = Path(output) if output is not None else src.with_name(src.name + ".consolidated.ckpt")
    # not Lightning's _load_distributed_checkpoint: it unpickles .metadata and meta.pt freely
    write_checkpoint(read_sharded(src), out)
    return out


def consolidated_if_sharded(p: Path) -> Path:
    """An FSDP sharded checkpoint folder -> its plain ``<folder>.consolidated.ckpt`` (made once,
    remade when the folder is newer); anything else unchanged."""
    if not is_sharded_checkpoint(p):
        return p
    out = p.with_name(p.name + ".consolidated.ckpt")
    if not out.is_file() or out.stat().st_mtime < (p / ".metadata").stat().st_mtime:
        consolidate_checkpoint(p, out)
    return out
