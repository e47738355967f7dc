"""The models both sides of the Python tests build: a transformers-free toy module and, where
transformers is installed, a tiny Llama (random init, nothing downloaded). Same `seed`, same
weights; `inputs()` is the fixed batch whose outputs are compared."""
import torch

TOY = "toy"
TINY_LLAMA = "tiny-llama"


class Toy(torch.nn.Module):
    """Embedding -> Linear -> LayerNorm -> Linear: 2-D, 1-D and bias parameters."""

    def __init__(self, vocab=50, hidden=48, out=24):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, hidden)
        self.proj = torch.nn.Linear(hidden, hidden)
        self.norm = torch.nn.LayerNorm(hidden)
        self.head = torch.nn.Linear(hidden, out, bias=False)

    def forward(self, ids):
        return self.head(self.norm(torch.relu(self.proj(self.embed(ids)))))


def build(kind: str, seed: int, dtype=torch.float32):
    torch.manual_seed(seed)
    if kind == TOY:
        model = Toy()
    elif kind == TINY_LLAMA:
        from transformers import LlamaConfig, LlamaForCausalLM

        cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                          tie_word_embeddings=False, attn_implementation="eager")
        model = LlamaForCausalLM(cfg)
    else:
        raise ValueError(kind)
    return model.to(dtype).eval()


def inputs(kind: str):
    g = torch.Generator().manual_seed(1234)
    return torch.randint(0, 50, (2, 7), generator=g)


def outputs(kind: str, model):
    with torch.no_grad():
        out = model(inputs(kind))
    return out.logits if hasattr(out, "logits") else out
