"""Byte-level tokenizer for the tiny fixture models: one token per UTF-8 byte, no download.

Token ids 0..255 are the byte values themselves; the special tokens follow them:

    256  <|endoftext|>   bos, eos
    257  <|pad|>         pad

It is a `tokenizers` BPE model with no merges over the GPT-2 byte-to-unicode alphabet (the
ByteLevel pre-tokenizer and decoder), so any UTF-8 text round-trips exactly and the saved folder
loads with `AutoTokenizer.from_pretrained(path)` offline.
"""

from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

NUM_BYTES = 256
EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"
SPECIAL_TOKENS = (EOS_TOKEN, PAD_TOKEN)
VOCAB_SIZE = NUM_BYTES + len(SPECIAL_TOKENS)
EOS_TOKEN_ID = NUM_BYTES
PAD_TOKEN_ID = NUM_BYTES + 1


def _byte_to_char() -> list[str]:
    """GPT-2's printable stand-in character for each byte value (the ByteLevel alphabet)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = [], 0
    for value in range(NUM_BYTES):
        if value in printable:
            chars.append(chr(value))
        else:
            # non-printable bytes are shifted past the Latin-1 range, in byte order
            chars.append(chr(NUM_BYTES + extra))
            extra += 1
    return chars


def _byte_vocab() -> dict[str, int]:
    """Vocabulary mapping each byte's stand-in character to the byte's value."""
    vocab = {char: value for value, char in enumerate(_byte_to_char())}
    assert set(vocab) == set(pre_tokenizers.ByteLevel.alphabet()), "byte map differs from the ByteLevel alphabet"
    return vocab


def build_byte_tokenizer() -> PreTrainedTokenizerFast:
    """A fresh byte-level tokenizer with eos/bos `<|endoftext|>` (256) and pad `<|pad|>` (257)."""
    tok = Tokenizer(models.BPE(vocab=_byte_vocab(), merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=EOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        model_max_length=1 << 20,
        clean_up_tokenization_spaces=False,
    )


def save_byte_tokenizer(path: str | Path) -> None:
    """Write the tokenizer files (tokenizer.json, tokenizer_config.json, ...) into `path`."""
    build_byte_tokenizer().save_pretrained(str(path))
