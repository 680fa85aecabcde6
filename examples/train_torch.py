"""The example training job for PyTorch users: the same workload contract as `train_numpy.py` (agent/protocol.py),
with a torch model, optimizer and `torch.save`.

- state (model, optimizer, step) saved atomically in `OVERSPILL_CHECKPOINT_DIR` every `CHECKPOINT_EVERY` steps and
  at once on SIGUSR1 (the agent's interruption notice; `OVERSPILL_NOTICE_FILE` holds its details), then exit;
- `OVERSPILL_PROGRESS_FILE` says `{"done", "total", "checkpoint"}` after each step;
- `OVERSPILL_RESUME=1`: continue from the saved state.
Batches are drawn from a generator seeded with `(SEED, step)` and the run is made deterministic
(`torch.use_deterministic_algorithms`), so on the same machine a resumed run ends with the weights an uninterrupted
one does. Needs `torch` (not a dependency of Overspill). Settings as `train_numpy.py`: STEPS, STEP_SECONDS,
CHECKPOINT_EVERY, SEED.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import signal
import sys
import time

import torch

CKPT = os.environ.get("OVERSPILL_CHECKPOINT_DIR", "checkpoint")
PROGRESS = os.environ.get("OVERSPILL_PROGRESS_FILE")
STEPS = int(os.environ.get("STEPS", "600"))
PAUSE = float(os.environ.get("STEP_SECONDS", "0.1"))
EVERY = int(os.environ.get("CHECKPOINT_EVERY", "100"))
SEED = int(os.environ.get("SEED", "0"))
interrupted = False


def on_notice(signum: int, frame: object) -> None:
    global interrupted
    interrupted = True


def write_atomic(path: str, data: bytes) -> None:
    with open(f"{path}.tmp", "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(f"{path}.tmp", path)


def report(done: int, checkpoint: int | None) -> None:
    if PROGRESS:
        write_atomic(PROGRESS, json.dumps({"done": done, "total": STEPS, "checkpoint": checkpoint}).encode())


def save(model: torch.nn.Module, opt: torch.optim.Optimizer, step: int) -> None:
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, buf)
    write_atomic(os.path.join(CKPT, "state.pt"), buf.getvalue())


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(SEED * 1_000_003 + step)
    x = torch.randn(64, 16, generator=gen, dtype=torch.float64)
    y = torch.sin(x[:, :1] * 2.0) + 0.5 * x[:, 1:2] * x[:, 2:3]
    return x, y


def main() -> int:
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(SEED)
    os.makedirs(CKPT, exist_ok=True)
    signal.signal(signal.SIGUSR1, on_notice)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1)).double()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    start = 0
    state = os.path.join(CKPT, "state.pt")
    if os.environ.get("OVERSPILL_RESUME") == "1" and os.path.exists(state):
        saved = torch.load(state, weights_only=True)
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["opt"])
        start = int(saved["step"])
        print(f"resumed from the checkpoint at step {start}", flush=True)
    saved_at: int | None = start or None
    for step in range(start, STEPS):
        if interrupted:
            save(model, opt, step)
            report(step, step)
            print(f"interruption notice: checkpoint saved at step {step}, exiting", flush=True)
            return 0
        x, y = batch(step)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        done = step + 1
        if done % 50 == 0:
            print(f"step {done}/{STEPS} loss {loss.item():.6f}", flush=True)
        if done % EVERY == 0 and done < STEPS:
            save(model, opt, done)
            saved_at = done
        report(done, saved_at)
        if PAUSE:
            time.sleep(PAUSE)
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    write_atomic(os.path.join(CKPT, "weights-final.pt"), buf.getvalue())
    save(model, opt, STEPS)
    report(STEPS, STEPS)
    digest = hashlib.sha256(b"".join(t.numpy().tobytes() for t in model.state_dict().values())).hexdigest()
    print(f"done: {STEPS} steps, weights sha256 {digest}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
