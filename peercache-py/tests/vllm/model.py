"""A Llama model with random weights written locally (no download, no tokenizer): the same
seed gives the same weights, so every engine of a test serves the same model."""

import sys


def make_model(path: str, layers: int = 4, hidden: int = 512, heads: int = 8, kv_heads: int = 4,
               vocab: int = 4096, seed: int = 0) -> str:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 2,
                      num_hidden_layers=layers, num_attention_heads=heads,
                      num_key_value_heads=kv_heads, max_position_embeddings=8192,
                      torch_dtype="bfloat16")
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(path)
    return path


if __name__ == "__main__":
    make_model(sys.argv[1], *map(int, sys.argv[2:]))
