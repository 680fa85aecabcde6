"""A small checkpointing training job (NumPy only) that follows Overspill's workload contract.

It trains a two-layer network on a synthetic regression task by SGD, deterministically: the batch of step `s`
comes from a generator seeded with `(SEED, s)`, so a run resumed from a checkpoint takes exactly the steps an
uninterrupted run takes and ends with bit-identical weights (float64, saved with `numpy.save`).

The contract (agent/protocol.py), which any training script can follow in a few lines:
- `OVERSPILL_CHECKPOINT_DIR`: save the state there, atomically (write a temporary file, rename it over); every
  `CHECKPOINT_EVERY` steps and when told of an interruption;
- `OVERSPILL_PROGRESS_FILE`: `{"done": step, "total": steps, "checkpoint": step of the last saved state}`, replaced
  atomically; when `checkpoint` grows, the agent uploads the directory to the checkpoint store;
- `OVERSPILL_NOTICE_FILE` and SIGUSR1: the provider is taking the machine back: save now and exit;
- `OVERSPILL_RESUME=1`: the directory was filled from the last durable checkpoint: continue from it.
Without the agent (no variables set) it runs in `./checkpoint` and writes no progress file.

Settings (environment): STEPS (default 600), STEP_SECONDS (an artificial pause per step so a drill can catch the job
mid-run, default 0.1), CHECKPOINT_EVERY (default 100), SEED (default 0). At the end it saves `weights-final.npz` in
the checkpoint directory and prints its SHA-256.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import signal
import sys
import time

import numpy as np

CKPT = os.environ.get("OVERSPILL_CHECKPOINT_DIR", "checkpoint")
PROGRESS = os.environ.get("OVERSPILL_PROGRESS_FILE")
STEPS = int(os.environ.get("STEPS", "600"))
PAUSE = float(os.environ.get("STEP_SECONDS", "0.1"))
EVERY = int(os.environ.get("CHECKPOINT_EVERY", "100"))
SEED = int(os.environ.get("SEED", "0"))
IN, HIDDEN, OUT, BATCH, LR = 16, 32, 1, 64, 0.01

interrupted = False


def on_notice(signum: int, frame: object) -> None:
    global interrupted
    interrupted = True


def write_atomic(path: str, data: bytes) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def npz_bytes(**arrays: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def save(weights: dict[str, np.ndarray], step: int) -> None:
    write_atomic(os.path.join(CKPT, "state.npz"), npz_bytes(step=np.array(step), **weights))


def report(done: int, checkpoint: int | None) -> None:
    if PROGRESS:
        body = {"done": done, "total": STEPS, "checkpoint": checkpoint}
        write_atomic(PROGRESS, json.dumps(body).encode())


def init() -> dict[str, np.ndarray]:
    rng = np.random.default_rng([SEED, 10**9])
    return {
        "w1": rng.normal(0, 1 / np.sqrt(IN), (IN, HIDDEN)),
        "b1": np.zeros(HIDDEN),
        "w2": rng.normal(0, 1 / np.sqrt(HIDDEN), (HIDDEN, OUT)),
        "b2": np.zeros(OUT),
    }


def batch(step: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng([SEED, step])
    x = rng.normal(size=(BATCH, IN))
    y = np.sin(x[:, :1] * 2.0) + 0.5 * x[:, 1:2] * x[:, 2:3]
    return x, y


def sgd_step(w: dict[str, np.ndarray], step: int) -> float:
    x, y = batch(step)
    h = np.tanh(x @ w["w1"] + w["b1"])
    pred = h @ w["w2"] + w["b2"]
    err = pred - y
    loss = float(np.mean(err**2))
    g = 2 * err / BATCH
    gw2, gb2 = h.T @ g, g.sum(0)
    gh = (g @ w["w2"].T) * (1 - h**2)
    gw1, gb1 = x.T @ gh, gh.sum(0)
    for name, grad in (("w1", gw1), ("b1", gb1), ("w2", gw2), ("b2", gb2)):
        w[name] -= LR * grad
    return loss


def main() -> int:
    os.makedirs(CKPT, exist_ok=True)
    signal.signal(signal.SIGUSR1, on_notice)
    state = os.path.join(CKPT, "state.npz")
    if os.environ.get("OVERSPILL_RESUME") == "1" and os.path.exists(state):
        with np.load(state) as saved:
            start = int(saved["step"])
            weights = {k: saved[k].copy() for k in ("w1", "b1", "w2", "b2")}
        print(f"resumed from the checkpoint at step {start}", flush=True)
    else:
        start, weights = 0, init()
        print(f"starting from scratch: {STEPS} steps", flush=True)
    saved_at: int | None = start if start else None
    report(start, saved_at)
    for step in range(start, STEPS):
        if interrupted:
            save(weights, step)
            report(step, step)
            print(f"interruption notice: checkpoint saved at step {step}, exiting", flush=True)
            return 0
        loss = sgd_step(weights, step)
        done = step + 1
        if done % 50 == 0:
            print(f"step {done}/{STEPS} loss {loss:.6f}", flush=True)
        if done % EVERY == 0 and done < STEPS:
            save(weights, done)
            saved_at = done
        report(done, saved_at)
        if PAUSE:
            time.sleep(PAUSE)
    final = npz_bytes(**weights)
    write_atomic(os.path.join(CKPT, "weights-final.npz"), final)
    save(weights, STEPS)
    report(STEPS, STEPS)
    print(f"done: {STEPS} steps, weights sha256 {hashlib.sha256(final).hexdigest()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
