"""The faster training forward (model.train_autocast, model.attn_implementation, model.compile)
computes what the plain one does, to the precision it trades, and trains the same parameters."""

import warnings

import pytest
import torch

from rlfw.build import build_policy_model, make_env_fn, prepare_base_model
from rlfw.config import EnvConfig, LoraConfig, ModelConfig
from rlfw.models import compile_language_model, native_bf16, resolve_train_autocast
from rlfw.policy import sequence_logprobs
from rlfw.rollout.demos import DemoSampler, to_segment
from tests.rlfw.test_policy_sync import SPEC


def _policy(tmp_path, lora_rank: int = 4, **model_fields):
    """The test's tiny policy from one seed (same weights whatever the fields) and 8 oracle segments."""
    make_env = make_env_fn(EnvConfig(name="maze", id="rlfw/Maze2D-v0", max_turns=2, kwargs={"cell_px": 8}))
    cfg = ModelConfig(name="tiny_vl", tiny=SPEC, lora=LoraConfig(rank=lora_rank, alpha=8), **model_fields)
    path = prepare_base_model(cfg, make_env, tmp_path, seed=0)
    torch.manual_seed(0)  # the LoRA init
    model, processor = build_policy_model(cfg, path)
    with torch.no_grad():  # a LoRA B of zeros would hide the adapter's gradient path from the checks
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.02)
    segments = [to_segment(processor, *s) for s in DemoSampler(make_env, 0, "all_squares", 0.0).sample(8)]
    return model, processor, segments


def _logprobs_and_grads(model, processor, segments, autocast=None):
    model.zero_grad(set_to_none=True)
    logp, mask, _ = sequence_logprobs(model, processor, segments, autocast=autocast)
    (-(logp * mask).sum() / mask.sum()).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    return logp.detach(), mask, grads


def _cosine(a: dict, b: dict) -> float:
    x = torch.cat([a[n].flatten() for n in a])
    y = torch.cat([b[n].flatten() for n in a])
    return float(x @ y / (x.norm() * y.norm()))


def test_bf16_autocast_runs_the_forward_in_bf16_and_trains_float32_weights(tmp_path):
    """Under model.train_autocast=bfloat16 the log-probs move by bf16's rounding (so the matmuls did
    run in bf16) and no more, the gradient points where float32's does, and the weights and their
    gradients stay float32 (AdamW's state too)."""
    model, processor, segments = _policy(tmp_path)
    logp32, mask, grads32 = _logprobs_and_grads(model, processor, segments)
    logp16, _, grads16 = _logprobs_and_grads(model, processor, segments, autocast="bfloat16")
    diff = ((logp16 - logp32).abs() * mask).max()
    assert 0 < diff < 0.05, diff
    assert _cosine(grads32, grads16) > 0.99
    assert all(g.dtype == torch.float32 for g in grads16.values())
    assert all(p.dtype == torch.float32 for p in model.parameters())


def _cpu_flags() -> set[str]:
    with open("/proc/cpuinfo") as f:
        return {flag for line in f if line.startswith("flags") for flag in line.split(":", 1)[1].split()}


@pytest.mark.skipif(not __import__("os").path.exists("/proc/cpuinfo"), reason="reads Linux's /proc/cpuinfo")
def test_native_bf16_is_this_cpus_avx512_bf16_or_amx():
    """torch's answer agrees with the CPU's own flags, read independently."""
    flags = _cpu_flags()
    assert native_bf16("cpu") == bool({"avx512_bf16", "amx_tile", "amx_bf16"} & flags)


def test_auto_autocast_is_bf16_only_where_the_hardware_has_it(monkeypatch):
    """auto: bfloat16 on a CPU with AVX512_BF16 or AMX, float32 (None) on an AVX2-only one; an explicit
    bfloat16 stays bfloat16 everywhere but warns where it would be emulated; None stays None."""
    for avx512_bf16, amx, want in [(True, False, "bfloat16"), (False, True, "bfloat16"), (False, False, None)]:
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda v=avx512_bf16: v)
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda v=amx: v)
        assert resolve_train_autocast("auto", "cpu") == want
        assert resolve_train_autocast(None, "cpu") is None
        if want:
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # native: no warning
                assert resolve_train_autocast("bfloat16", "cpu") == "bfloat16"
        else:
            with pytest.warns(UserWarning, match="no native bf16"):
                assert resolve_train_autocast("bfloat16", "cpu") == "bfloat16"


def test_eager_attention_is_loaded_in_both_towers_and_matches_sdpa(tmp_path):
    sdpa, processor, segments = _policy(tmp_path / "sdpa")
    eager, _, _ = _policy(tmp_path / "eager", attn_implementation="eager")
    config = eager.base_model.model.config
    assert config.text_config._attn_implementation == "eager"
    assert config.vision_config._attn_implementation == "eager"
    logp_s, mask, grads_s = _logprobs_and_grads(sdpa, processor, segments)
    logp_e, _, grads_e = _logprobs_and_grads(eager, processor, segments)
    torch.testing.assert_close(logp_e * mask, logp_s * mask, atol=1e-5, rtol=1e-5)
    for name in grads_s:
        torch.testing.assert_close(grads_e[name], grads_s[name], atol=1e-5, rtol=1e-4)


@pytest.mark.slow  # compiling the two towers takes about a minute on 2 cores
def test_compiled_towers_train_like_eager_ones_and_generation_stays_eager(tmp_path):
    """compile_language_model compiles the language model under the LoRA wrapper; the compiled forward
    and backward match the eager ones, on a second batch of another size too (dynamic shapes); and
    generation under force_eager returns what the uncompiled model does."""
    model, processor, segments = _policy(tmp_path, attn_implementation="eager")
    reference, _, _ = _policy(tmp_path, attn_implementation="eager")
    decoder = compile_language_model(model)
    assert decoder is model.base_model.model.model.language_model and decoder._compiled_call_impl is not None
    for batch in (segments, segments[:5]):
        logp_c, mask, grads_c = _logprobs_and_grads(model, processor, batch)
        logp_e, _, grads_e = _logprobs_and_grads(reference, processor, batch)
        torch.testing.assert_close(logp_c * mask, logp_e * mask, atol=1e-5, rtol=1e-5)
        for name in grads_e:
            torch.testing.assert_close(grads_c[name], grads_e[name], atol=1e-5, rtol=1e-4)
    from rlfw.models.processing import collate

    seg = segments[0]
    prompt = seg.token_ids[: seg.loss_mask.index(1)]
    batch = collate([prompt], [[processor.image_features(img) for img in seg.images]], processor.image_token_id,
                    processor.pad_token_id, left_pad=True)
    outs = []
    for m in (model, reference):
        with torch.no_grad(), torch.compiler.set_stance("force_eager"):
            outs.append(m.generate(**batch, max_new_tokens=3, do_sample=False)[0, len(prompt):].tolist())
    assert outs[0] == outs[1]
