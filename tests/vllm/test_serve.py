"""`python -m rlfw.serve` (Ray Serve LLM, vLLM on this CPU) with adapters from a local folder, served
to Ray from rlfw's loopback S3 server, queried through the real `openai` client.

One server for the module (about 1-2 minutes to come up), started as a user would, bound to
127.0.0.1 with an API key, and stopped by its process group at the end. Every request loop is
bounded in count and time. Marked `vllm`: `.venv-vllm/bin/python -m pytest -m vllm tests/vllm`.
"""

from __future__ import annotations

import base64
import io
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from rlfw.config import repo_root

pytestmark = pytest.mark.vllm
ROOT = Path(repo_root())
SHIPPED = ROOT / "checkpoints" / "tiny_vl_maze_sft"
BASE = SHIPPED.name
KEY = "test-key-7f3a"


def make_adapter(out: Path, scale: float, seed: int) -> None:
    """A rank-8 LoRA on the shipped policy with random A and B scaled by `scale` (0: no change)."""
    import torch

    from rlfw.models import apply_lora, load_policy

    torch.manual_seed(seed)
    model, _ = load_policy(str(SHIPPED))
    model = apply_lora(model, 8, 16, 0.0, ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn_like(p) * scale)
    model.save_pretrained(str(out))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """`python -m rlfw.serve` with adapters a1 (a small change) and a2 (a large one) exported to a
    local folder; yields (base URL, adapters folder, its log)."""
    tmp = tmp_path_factory.mktemp("serve")
    raw, adapters = tmp / "raw", tmp / "adapters"
    for name, scale, seed in [("a1", 0.02, 1), ("a2", 0.2, 2)]:
        make_adapter(raw / name, scale, seed)
        subprocess.run([sys.executable, "-m", "rlfw.serve.export", str(raw / name), str(adapters), "--name", name],
                       cwd=ROOT, check=True, capture_output=True, timeout=120)
    port = _free_port()
    log = open(tmp / "serve.log", "w")
    env = {**os.environ, "RLFW_SERVE_API_KEY": KEY}
    proc = subprocess.Popen([sys.executable, "-m", "rlfw.serve", f"serve.adapters_path={adapters}",
                             f"serve.port={port}", f"hydra.run.dir={tmp / 'hydra'}"],
                            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while "rlfw.serve: ready" not in (tmp / "serve.log").read_text():
            assert proc.poll() is None, (tmp / "serve.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the server did not come up in 10 minutes"
            time.sleep(2)
        yield url, adapters, tmp / "serve.log"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        log.close()


@pytest.fixture(scope="module")
def states():
    """Maze turns as the agent loop builds them: 12 states of eval64 mazes along the oracle's path."""
    from envs.eval_sets import load_eval_set

    from rlfw.build import make_env_fn
    from rlfw.config import MazeEnvConfig
    from rlfw.rollout.agent_loop import turn_message

    env = make_env_fn(MazeEnvConfig(name="maze", id="rlfw/Maze2D-v0", max_turns=20), crop_px=8)()
    out = []
    for layout in load_eval_set("eval64")[:6]:
        obs, _ = env.reset(options={"layout": layout})
        task, feedback = obs["text"], ""
        for _ in range(2):
            out.append((obs["image"], turn_message(task, feedback)))
            obs = env.step(env.unwrapped.best_action())[0]
            feedback = obs["text"]
    return out


def in_process_replies(states, adapter: Path | None) -> list[str]:
    """Greedy replies of rlfw's own engine (the adapter merged), decoded as the env would read them."""
    from peft import PeftModel

    from rlfw.models import load_policy
    from rlfw.rollout.engine import TransformersEngine
    from rlfw.rollout.types import Prompt, SamplingParams

    model, processor = load_policy(str(SHIPPED))
    if adapter is not None:
        model = PeftModel.from_pretrained(model, str(adapter))
    engine = TransformersEngine(model.requires_grad_(False), processor)
    prompts = [Prompt(processor.encode_message(m, [im]) + processor.generation_prompt_ids, [im]) for im, m in states]
    return [processor.decode(c.token_ids) for c in engine.generate(prompts, SamplingParams(max_new_tokens=8, greedy=True))]


def client(url: str, key: str = KEY):
    from openai import OpenAI

    return OpenAI(base_url=f"{url}/v1", api_key=key, timeout=120, max_retries=0)


def ask(c, model: str, state) -> str:
    from rlfw.rollout.openai_engine import openai_messages
    from rlfw.rollout.types import Prompt

    image, message = state
    reply = c.chat.completions.create(model=model, messages=openai_messages(Prompt([], [image], messages=[message])),
                                      max_tokens=8, temperature=0.0)
    return reply.choices[0].message.content


def test_base_and_adapters_answer_as_their_weights_do(server, states):
    url, adapters, _ = server
    c = client(url)
    assert sorted(m.id for m in c.models.list()) == [BASE, f"{BASE}:a1", f"{BASE}:a2"]
    served = {m: [ask(c, m, s) for s in states] for m in [BASE, f"{BASE}:a1", f"{BASE}:a2"]}
    expected = {BASE: in_process_replies(states, None), f"{BASE}:a1": in_process_replies(states, adapters / "a1"),
                f"{BASE}:a2": in_process_replies(states, adapters / "a2")}
    assert served == expected  # every reply from the right weights
    assert served[BASE] != served[f"{BASE}:a2"]  # and the adapter's weights change them


def test_eval_through_the_endpoint_reproduces_the_in_process_adapter(server, tmp_path):
    """`rlfw.eval` of base:a1 at the endpoint plays eval64 exactly as `rlfw.eval eval.adapter=a1` in process."""
    url, adapters, _ = server
    common = [sys.executable, "-m", "rlfw.eval", "eval.save_gifs=0"]
    env = {**os.environ, "OPENAI_API_KEY": KEY}
    for name, extra in [("endpoint", [f"eval.base_url={url}/v1", f"eval.model={BASE}:a1", "eval.concurrency=8"]),
                        ("inprocess", [f"eval.adapter={adapters / 'a1'}"])]:
        subprocess.run([*common, *extra, f"eval.output_dir={tmp_path / name}", f"hydra.run.dir={tmp_path / name}_h"],
                       cwd=ROOT, env=env, check=True, capture_output=True, timeout=900)
    got, want = (json.loads((tmp_path / n / "metrics.json").read_text()) for n in ("endpoint", "inprocess"))
    assert got["eval/eval64/pass_at_1"] == want["eval/eval64/pass_at_1"]
    assert got["model"] == f"{BASE}:a1" and got["base_url"] == f"{url}/v1"
    played = [[json.loads(line)["actions"] for line in (tmp_path / n / "eval64" / "episodes.jsonl").read_text().splitlines()]
              for n in ("endpoint", "inprocess")]
    assert played[0] == played[1] and len(played[0]) == 64


def _png(w: int, h: int) -> str:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.zeros((h, w, 3), np.uint8)).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _post(url: str, body: dict | None = None, raw: bytes | None = None, key: str | None = KEY, path="/v1/chat/completions"):
    data = raw if raw is not None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    req = urllib.request.Request(url + path, data=data if body is not None or raw is not None else None, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def _chat(model: str, image_url: str) -> dict:
    return {"model": model, "max_tokens": 4, "temperature": 0,
            "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": image_url}},
                                                      {"type": "text", "text": "Where next?"}]}]}


def test_bad_input_is_refused_and_the_next_request_succeeds(server):
    url, _, log = server
    good = _png(56, 56)
    assert _post(url, _chat(BASE, good))[0] == 200
    # the API key
    assert _post(url, _chat(BASE, good), key=None)[0] == 401
    assert _post(url, _chat(BASE, good), key="wrong")[0] == 401
    assert _post(url, path="/v1/models", key=None)[0] == 401
    # adapter names: refused before any storage access
    before = log.read_text().count("GET /rlfw-adapters")
    for name in ["../a1", "a1/../a2", "x/y", "s3://bucket/a1", "a b", "$(touch x)", "a;rm", ".hidden", "é", "a" * 129]:
        status, body = _post(url, _chat(f"{BASE}:{name}", good))
        assert status == 400 and "adapter name" in body, (name, status, body)
    assert _post(url, path=f"/v1/models/{BASE}:..%2Fa1")[0] == 400
    time.sleep(1)
    assert log.read_text().count("GET /rlfw-adapters") == before  # the S3 server saw none of them
    # unknown adapter or base model
    assert _post(url, _chat(f"{BASE}:nope", good))[0] == 404
    assert _post(url, _chat("other-model", good))[0] == 404
    # malformed requests and images
    assert _post(url, raw=b'{"model": "tiny_vl_maze_sft", "messages": [')[0] in (400, 422)
    assert _post(url, {"model": BASE})[0] in (400, 422)  # no messages
    assert _post(url, _chat(BASE, _png(1100, 1000)))[0] == 413  # over serve.max_image_pixels
    assert _post(url, _chat(BASE, "data:image/png;base64,@@not-base64@@"))[0] == 400
    assert _post(url, _chat(BASE, "data:image/png;base64," + base64.b64encode(b"not an image").decode()))[0] == 400
    assert _post(url, _chat(BASE, "http://127.0.0.1:9/maze.png"))[0] == 400  # never fetched
    status, body = _post(url, _chat(f"{BASE}:a2", good))
    assert status == 200 and json.loads(body)["choices"][0]["message"]["content"] is not None


def test_eight_clients_two_hundred_requests_each(server, states):
    """1,600 requests from 8 threads, mixing the base and both adapters: no errors, every reply the
    one its model gives in process."""
    url, adapters, _ = server
    models = [BASE, f"{BASE}:a1", f"{BASE}:a2"]
    expected = {BASE: in_process_replies(states, None), models[1]: in_process_replies(states, adapters / "a1"),
                models[2]: in_process_replies(states, adapters / "a2")}

    def one_client(k: int) -> list[tuple[str, int, str]]:
        c = client(url)
        out = []
        deadline = time.monotonic() + 900
        for i in range(200):
            assert time.monotonic() < deadline
            model, s = models[(k + i) % 3], (k * 7 + i) % len(states)
            out.append((model, s, ask(c, model, states[s])))
        return out

    with ThreadPoolExecutor(8) as pool:
        results = [r for rs in pool.map(one_client, range(8)) for r in rs]
    assert len(results) == 1600
    wrong = [(m, s, got) for m, s, got in results if got != expected[m][s]]
    assert not wrong, wrong[:5]
