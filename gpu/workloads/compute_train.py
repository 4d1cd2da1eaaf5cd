"""PyTorch training loop for the "compute" group of the acceptance runner (issue 18; protocol:
wlproto.py): a GPU-bound MLP (WL_TRAIN_LAYERS (4) x Linear(WL_TRAIN_DIM, WL_TRAIN_DIM) with
ReLU, batch WL_TRAIN_BATCH (4096), MSE loss, SGD; TF32 matmuls), fixed seed.

    python3 compute_train.py

Lines: PID, FRAMEWORK, INIT_OK, WARM steps=, READY step=train (waits for a stdin line), then
training steps back to back for WL_SECONDS (3) s, each ending with a synchronisation, and
`RESULT steps= seconds= sps= loss_first= loss_last=`; DONE rc=. An exception prints
STEP_ERROR step= err=.
"""

import os
import sys
import time

import wlproto


def main():
    wlproto.emit("PID", pid=os.getpid())
    try:
        import torch

        torch.backends.cuda.matmul.allow_tf32 = True
        dim = int(os.environ.get("WL_TRAIN_DIM", "4096"))
        batch = int(os.environ.get("WL_TRAIN_BATCH", "4096"))
        layers = int(os.environ.get("WL_TRAIN_LAYERS", "4"))
        seconds = float(os.environ.get("WL_SECONDS", "3"))
        torch.manual_seed(0)
        mods = []
        for _ in range(layers):
            mods += [torch.nn.Linear(dim, dim), torch.nn.ReLU()]
        model = torch.nn.Sequential(*mods).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=1e-4)
        x = torch.randn(batch, dim, device="cuda")
        y = torch.randn(batch, dim, device="cuda")
        wlproto.emit("FRAMEWORK", name="torch", version=torch.__version__, dim=dim, batch=batch,
                     layers=layers)
        wlproto.emit("INIT_OK")

        def step():
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            torch.cuda.synchronize()
            return loss

        for _ in range(5):
            step()
        wlproto.emit("WARM", steps=5)
    except Exception as e:  # noqa: BLE001 - reported, the runner decides
        wlproto.emit("STEP_ERROR", step="init", err=wlproto.one_line(e))
        wlproto.emit("DONE", rc=2)
        return 2
    wlproto.wait_signal("train")
    try:
        n, first, last = 0, None, None
        t0 = time.monotonic()
        end = t0 + seconds
        while time.monotonic() < end:
            loss = step()
            n += 1
            if first is None:
                first = float(loss.item())
        last = float(loss.item()) if n else None
        t1 = time.monotonic()
        wlproto.emit("RESULT", steps=n, seconds=f"{t1 - t0:.4f}", sps=f"{n / (t1 - t0):.3f}",
                     loss_first=first, loss_last=last)
    except Exception as e:  # noqa: BLE001
        wlproto.emit("STEP_ERROR", step="train", err=wlproto.one_line(e))
        wlproto.emit("DONE", rc=1)
        return 1
    wlproto.emit("DONE", rc=0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
