"""A small, deterministic numpy training job that speaks the agent's workload protocol (agent/protocol.py).

It fits a two-layer network to a fixed synthetic regression problem with minibatch SGD for `TRAIN_STEPS` steps,
drawing the minibatches from a seeded generator. Every `TRAIN_CHECKPOINT_EVERY` steps, and at the next step after
the agent's notice signal (SIGUSR1), it writes `state.npz` (weights, step, the generator's state) into
`$OVERSPILL_CHECKPOINT_DIR` atomically (temporary file + rename) and then `$OVERSPILL_PROGRESS_FILE`
(`{"done", "total", "checkpoint"}`). With `OVERSPILL_RESUME=1` it continues from `state.npz`, so an interrupted and
resumed run ends with exactly the weights of an uninterrupted one. At the end it writes `final.npy`.

It prints one line per step on stdout and every tenth step a line on stderr. Test knobs (environment):
TRAIN_STEPS (200), TRAIN_CHECKPOINT_EVERY (50), TRAIN_STEP_SECONDS (0.01, a sleep per step), TRAIN_FAIL_AT_STEP
(exit 3 there: a user failure), TRAIN_PRINT_ENV (print that variable's value: the agent must redact secrets),
TRAIN_SIGNAL_LOG (append the time each notice signal arrived), TRAIN_EXIT_ON_NOTICE (exit 0 after the notice
checkpoint instead of training on).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import numpy as np

SEED = 1234
STEPS = int(os.environ.get("TRAIN_STEPS", "200"))
EVERY = int(os.environ.get("TRAIN_CHECKPOINT_EVERY", "50"))
STEP_SECONDS = float(os.environ.get("TRAIN_STEP_SECONDS", "0.01"))
FAIL_AT = int(os.environ.get("TRAIN_FAIL_AT_STEP", "-1"))
CKPT_DIR = os.environ["OVERSPILL_CHECKPOINT_DIR"]
PROGRESS = os.environ["OVERSPILL_PROGRESS_FILE"]
NOTICE = os.environ["OVERSPILL_NOTICE_FILE"]
notified = 0  # notice signals received


def on_notice(signum: int, frame: object) -> None:
    global notified
    notified += 1
    log = os.environ.get("TRAIN_SIGNAL_LOG")
    if log:
        with open(log, "a") as out:
            out.write(f"{time.time():.6f}\n")


def write_atomic(path: str, data: bytes) -> None:
    tmp = path + ".tmp"
    with open(tmp, "wb") as out:
        out.write(data)
    os.replace(tmp, path)


def save(state: dict, step: int) -> None:
    tmp = os.path.join(CKPT_DIR, "state.npz.tmp")
    with open(tmp, "wb") as out:
        np.savez(out, w1=state["w1"], w2=state["w2"], step=np.int64(step), rng=np.array(json.dumps(state["rng"])))
    os.replace(tmp, os.path.join(CKPT_DIR, "state.npz"))
    write_atomic(PROGRESS, json.dumps({"done": step, "total": STEPS, "checkpoint": step}).encode())


def main() -> int:
    signal.signal(signal.SIGUSR1, on_notice)
    data_rng = np.random.default_rng(SEED)
    x = data_rng.normal(size=(512, 8))
    y = np.sin(x @ data_rng.normal(size=(8, 1))) + 0.1 * data_rng.normal(size=(512, 1))
    rng = np.random.default_rng(SEED + 1)
    w1 = rng.normal(scale=0.3, size=(8, 16))
    w2 = rng.normal(scale=0.3, size=(16, 1))
    step = 0
    ckpt = os.path.join(CKPT_DIR, "state.npz")
    if os.environ.get("OVERSPILL_RESUME") == "1" and os.path.exists(ckpt):
        with np.load(ckpt) as saved:
            w1, w2, step = saved["w1"], saved["w2"], int(saved["step"])
            rng.bit_generator.state = json.loads(str(saved["rng"]))
        print(f"resumed at step {step}", flush=True)
    last_ckpt = step
    secret_name = os.environ.get("TRAIN_PRINT_ENV")
    if secret_name:
        print(f"{secret_name}={os.environ.get(secret_name, '')}", flush=True)
    handled = 0
    while step < STEPS:
        if step == FAIL_AT:
            print(f"step {step}: loss is NaN, giving up", file=sys.stderr, flush=True)
            return 3
        idx = rng.integers(0, len(x), size=32)
        xb, yb = x[idx], y[idx]
        h = np.tanh(xb @ w1)
        err = h @ w2 - yb
        loss = float(np.mean(err**2))
        g2 = h.T @ err * (2 / len(xb))
        g1 = xb.T @ ((err @ w2.T) * (1 - h**2)) * (2 / len(xb))
        w1 = w1 - 0.05 * g1
        w2 = w2 - 0.05 * g2
        step += 1
        print(f"step {step} loss {loss:.6f}", flush=True)
        if step % 10 == 0:
            print(f"step {step}: stderr line", file=sys.stderr, flush=True)
        state = {"w1": w1, "w2": w2, "rng": rng.bit_generator.state}
        if step % EVERY == 0 or notified > handled:
            save(state, step)
            last_ckpt = step
            if notified > handled:
                handled = notified
                with open(NOTICE) as fp:
                    print(f"notice {json.load(fp)['kind']}: checkpointed at step {step}", flush=True)
                if os.environ.get("TRAIN_EXIT_ON_NOTICE") == "1":
                    return 0
        else:
            write_atomic(PROGRESS, json.dumps({"done": step, "total": STEPS, "checkpoint": last_ckpt or None}).encode())
        time.sleep(STEP_SECONDS)
    final = os.path.join(CKPT_DIR, "final.npy")
    with open(final + ".tmp", "wb") as out:
        np.save(out, np.concatenate([w1.ravel(), w2.ravel()]))
    os.replace(final + ".tmp", final)
    write_atomic(PROGRESS, json.dumps({"done": STEPS, "total": STEPS, "checkpoint": STEPS}).encode())
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
