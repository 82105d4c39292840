"""Our tokenizer as a Hugging Face ``PreTrainedTokenizerFast``, for the folders ``duolm export``
writes (Llama and LLaDA formats).

The byte tokenizer has no ``tokenizers`` backend of its own. It is exported as a byte-level BPE
without merges whose vocabulary maps GPT-2's printable stand-in for byte b to id b, so the
Hugging Face tokenizer turns text into exactly our ids (the UTF-8 bytes) and decodes them back.
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import AddedToken, decoders, models, pre_tokenizers, processors
from tokenizers import Tokenizer as Backend

from shared import door
from shared.tokenizer import EOS_TOKEN, PAD_TOKEN, Tokenizer, is_hf_kind
from shared.tokenizer_backends import bytes_to_unicode


def require_transformers():
    try:
        import transformers
    except ImportError as error:
        raise ImportError(
            "exporting to Hugging Face needs the optional dependency transformers: "
            'pip install -e ".[hf]"'
        ) from error
    return transformers


def hf_tokenizer(tokenizer: Tokenizer, saved_dir: Path, max_length: int):
    """A ``PreTrainedTokenizerFast`` equal to ``tokenizer``: same ids for every text (literal
    special-token text included), the two specials at our ids, nothing added to a text (training
    rows open with BOS: put ``bos_token_id`` in front to condition as they do), left padding.

    Our own kinds name the specials ``<|endoftext|>`` and ``<|pad|>``; an ``hf:`` tokenizer
    keeps its own names for them (e.g. ``[SEP]``/``[PAD]``), and gets ``<|pad|>`` only when we
    appended a padding id to its vocabulary. ``saved_dir`` holds ``tokenizer.save``'s files (the
    tokenizer.json is read from there, so nothing private of ``Tokenizer`` is touched)."""
    transformers = require_transformers()

    if tokenizer.kind == "byte":
        to_char = bytes_to_unicode()
        backend = Backend(models.BPE(vocab={to_char[b]: b for b in range(256)}, merges=[]))
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        backend.decoder = decoders.ByteLevel()
    else:
        text = door.read_text(saved_dir / "tokenizer.json", limit=door.TOKENIZER_LIMIT)
        backend = Backend.from_str(text)
    eos_name, pad_name = EOS_TOKEN, PAD_TOKEN
    if is_hf_kind(tokenizer.kind):
        eos_name = backend.id_to_token(tokenizer.eos_id)
        pad_name = backend.id_to_token(tokenizer.pad_id) or PAD_TOKEN
    # (re)register both as special: skipped when decoding, never split by the model's rules
    backend.add_special_tokens(
        [AddedToken(token, special=True, normalized=False) for token in (eos_name, pad_name)]
    )
    for token, wanted in ((eos_name, tokenizer.eos_id), (pad_name, tokenizer.pad_id)):
        got = backend.token_to_id(token)
        if got != wanted:
            raise ValueError(f"{token} landed at id {got} in the exported tokenizer, not {wanted}")
    # No specials added to a text (as GPT-2's tokenizer): lm-eval's hf backend puts BOS in front
    # of a rolling text and an empty context itself, so a tokenizer that added one too gave
    # [BOS, BOS] + text there, and no single hf setting then matched duolm's own scoring.
    backend.post_processor = processors.TemplateProcessing(single="$A", pair="$A $B")
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=eos_name,
        eos_token=eos_name,
        pad_token=pad_name,
        padding_side="left",
        model_max_length=max_length,
        # like ours, treat a literal "<|endoftext|>" in user text as text, never as the special
        split_special_tokens=True,
    )
