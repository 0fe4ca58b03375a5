"""The reference LLM in Hugging Face's format, for third-party servers (`transformers serve`):
``python -m optlab.reference.llm.export OUT_DIR``.

The network is GPT-2's (pre-norm blocks, learned positions, a tied head, exact GELU, layer
norm epsilon 1e-5), so the weights map one to one: each linear layer's weight is transposed
into GPT-2's `Conv1D` form. The tokenizer is a fast word-level one over the same vocabulary
(whitespace-separated words, `<eos>` first as the reference server puts it; a word outside the
vocabulary is `<unk>`, where optlab's own server hashes it onto a known word), and `<unk>` is
never generated: greedy answers to prompts of known words are the reference server's, word for
word. Needs `transformers` and `tokenizers`, which optlab itself does not: run it with the
Python that has them (PYTHONPATH pointing at optlab's `src/`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from optlab.reference.llm.model import load_reference
from optlab.reference.llm.tokenizer import EOS, SPECIALS, UNK

__all__ = ["export"]


def export(out: Path) -> Path:
    """Write config, weights and tokenizer under `out`; checks that the exported model's
    logits equal the reference's on a prompt before returning."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    model, tokenizer = load_reference()
    c = model.config
    config = GPT2Config(
        vocab_size=c.vocab, n_positions=c.max_len, n_embd=c.d_model, n_layer=c.n_layers,
        n_head=c.n_heads, n_inner=c.d_ff, activation_function="gelu", resid_pdrop=0.0,
        embd_pdrop=0.0, attn_pdrop=0.0, layer_norm_epsilon=1e-5, bos_token_id=EOS,
        eos_token_id=EOS, pad_token_id=EOS, tie_word_embeddings=True,
    )  # fmt: skip
    hf = GPT2LMHeadModel(config)
    ours = model.state_dict()
    state = {
        "transformer.wte.weight": ours["tok.weight"],
        "transformer.wpe.weight": ours["pos.weight"],
        "transformer.ln_f.weight": ours["ln_f.weight"],
        "transformer.ln_f.bias": ours["ln_f.bias"],
        "lm_head.weight": ours["tok.weight"],
    }
    pairs = (
        ("ln1", "ln_1", False),
        ("ln2", "ln_2", False),
        ("qkv", "attn.c_attn", True),
        ("proj", "attn.c_proj", True),
        ("fc1", "mlp.c_fc", True),
        ("fc2", "mlp.c_proj", True),
    )
    for i in range(c.n_layers):
        for mine, theirs, transpose in pairs:
            weight = ours[f"blocks.{i}.{mine}.weight"]
            state[f"transformer.h.{i}.{theirs}.weight"] = (
                weight.t().contiguous() if transpose else weight
            )
            state[f"transformer.h.{i}.{theirs}.bias"] = ours[f"blocks.{i}.{mine}.bias"]
    missing, unexpected = hf.load_state_dict(state, strict=False)
    assert not unexpected, unexpected
    assert all(".attn.bias" in k or ".attn.masked_bias" in k for k in missing), missing
    hf.eval()
    ids = [EOS, *tokenizer.encode("The for statement is used to iterate over", hash_unknown=False)]
    with torch.inference_mode():
        exported = hf(torch.tensor([ids])).logits[0, -1]
        reference = model.last_logits(torch.tensor([ids]), torch.tensor([len(ids)]))[0]
    gap = float((exported - reference).abs().max())
    if gap > 1e-3:
        raise RuntimeError(f"the exported model's logits differ from the reference's by {gap}")
    out.mkdir(parents=True, exist_ok=True)
    # The reference server never answers `<unk>`; neither may the exported model.
    hf.generation_config.suppress_tokens = [UNK]
    hf.save_pretrained(out)
    vocab = {word: i for i, word in enumerate(tokenizer.vocabulary)}
    fast = Tokenizer(models.WordLevel(vocab=vocab, unk_token=SPECIALS[0]))
    fast.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast.decoder = decoders.WordPiece(prefix="\x00##", cleanup=False)  # words joined by spaces
    # Every prompt starts with the document separator, as the reference server's do.
    fast.post_processor = processors.TemplateProcessing(
        single=f"{SPECIALS[1]} $A", special_tokens=[(SPECIALS[1], EOS)]
    )
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=fast, unk_token=SPECIALS[0], eos_token=SPECIALS[1], pad_token=SPECIALS[1],
        bos_token=SPECIALS[1], model_max_length=c.max_len,
    )  # fmt: skip
    wrapped.chat_template = "{% for message in messages %}{{ message['content'] }} {% endfor %}"
    wrapped.save_pretrained(out)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("out", type=Path)
    args = parser.parse_args(argv)
    print(f"wrote {export(args.out)}")


if __name__ == "__main__":
    main()
