"""Training-step benchmark for the acceptance runner: a small transformer encoder.

Fixed seed, fixed synthetic batch; WL_TRAIN_WARMUP (20) untimed steps, then WL_TRAIN_STEPS
(200) timed steps. Prints:
  TRAIN steps=.. ms_per_step=.. loss_first=.. loss_last=.. reserved=.. seconds=..
"""

import os
import sys
import time


def main():
    import torch
    from torch import nn

    steps = int(os.environ.get("WL_TRAIN_STEPS", "200"))
    warmup = int(os.environ.get("WL_TRAIN_WARMUP", "20"))
    torch.manual_seed(0)
    dev = "cuda"
    d_model, vocab, batch, seq = 256, 1000, 32, 128
    layer = nn.TransformerEncoderLayer(
        d_model=d_model, nhead=8, dim_feedforward=1024, dropout=0.0, batch_first=True
    )
    emb = nn.Embedding(vocab, d_model)
    enc = nn.TransformerEncoder(layer, num_layers=4, enable_nested_tensor=False)
    head = nn.Linear(d_model, vocab)
    model = nn.ModuleDict({"emb": emb, "enc": enc, "head": head}).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, vocab, (batch, seq), generator=g).to(dev)
    y = torch.randint(0, vocab, (batch, seq), generator=g).to(dev)
    loss_fn = nn.CrossEntropyLoss()

    def step():
        opt.zero_grad(set_to_none=True)
        out = model["head"](model["enc"](model["emb"](x)))
        loss = loss_fn(out.reshape(-1, vocab), y.reshape(-1))
        loss.backward()
        opt.step()
        return loss

    first = None
    for _ in range(warmup):
        loss = step()
        if first is None:
            first = float(loss.item())
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        loss = step()
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    print(
        f"TRAIN steps={steps} ms_per_step={dt * 1000 / steps:.3f} loss_first={first:.4f} "
        f"loss_last={float(loss.item()):.4f} reserved={torch.cuda.memory_reserved()} "
        f"seconds={dt:.2f}",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
