"""Every config group option and experiment preset composes against its schema and validates."""

import importlib.util
import re
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from rlfw.config import register_configs
from rlfw.validation import ConfigError, validate, validate_sft

CONF = Path(__file__).resolve().parents[2] / "conf"
register_configs()


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def load(overrides: list[str]):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["trainer.output_dir=/tmp/rlfw-test", *overrides])
    return OmegaConf.to_object(cfg)


def load_sft(overrides: list[str]):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="sft", overrides=["sft.output_dir=/tmp/rlfw-test", *overrides])
    return OmegaConf.to_object(cfg)


@pytest.mark.parametrize("group", ["algo", "env", "model", "cluster", "logger", "experiment"])
def test_every_option_composes_and_validates(group):
    assert options(group), f"conf/{group} is empty"
    for name in options(group):
        if name.startswith("sft_"):  # presets of `python -m rlfw.sft`
            validate_sft(load_sft([f"{group}={name}"]))
            continue
        extra = ["env.id=rlfw/GridGoal-v0"] if (group, name) == ("env", "custom") else []
        cfg = load([f"{group}={name}", *extra])
        validate(cfg, environment=False)  # cluster presets name engines this machine may not have


def test_algo_presets_pick_registered_variants():
    names = {n: load([f"algo={n}"]).algo for n in options("algo")}
    assert names["grpo"].advantage_estimator == "grpo"
    assert names["dr_grpo"].advantage_estimator == "dr_grpo" and names["dr_grpo"].loss_reduction == "seq-mean-token-sum"
    assert names["rloo"].advantage_estimator == "rloo"
    assert names["gspo"].policy_loss_type == "gspo"
    assert names["dapo"].dynamic_sampling != "off" and names["dapo"].eps_clip_high > names["dapo"].eps_clip_low
    assert names["gigpo"].step_advantage_weight > 0 and names["grpo"].step_advantage_weight == 0


def test_unknown_key_fails_at_compose():
    with pytest.raises(ConfigCompositionException):
        load(["algo.learning_rate=1e-3"])


def test_wrong_type_fails_at_compose():
    with pytest.raises(ConfigCompositionException):
        load(["algo.lr=fast"])


@pytest.mark.parametrize(
    "overrides, needle",
    [
        (["algo.n_samples_per_prompt=1"], "n_samples_per_prompt>=2"),
        (["algo.tasks_per_step=8", "algo.tasks_per_optimizer_step=3"], "divide algo.tasks_per_step"),
        (["algo.advantage_estimator=ppo_gae"], "algo.advantage_estimator"),
        (["env.history=some"], "env.history"),
        (["model.lora.rank=-1"], "model.lora.rank"),
        (["algo.max_sample_rounds=0"], "algo.max_sample_rounds"),
        (["algo=gspo", "algo.loss_reduction=token-mean"], "gspo"),
        (["model.lora.dropout=0.1"], "model.lora.dropout"),
        (["env.difficulty=hard"], "env.eval_set=eval64 holds easy"),
        (["trainer.heldout_eval_size=64", "trainer.eval_interval=0"], "trainer.heldout_eval_size"),
        (["cluster.engine_backend=vllm", "cluster.vllm.max_lora_rank=24"], "cluster.vllm.max_lora_rank=24 is not"),
        (["cluster.engine_backend=vllm", "cluster.vllm.max_lora_rank=16", "model.lora.rank=32"], "model.lora.rank=32 exceeds"),
        (["cluster.engine_backend=vllm", "cluster.vllm.memory_utilization=1.5"], "cluster.vllm.memory_utilization"),
        (["cluster.engine_backend=vllm", "cluster.vllm.tensor_parallel_size=2"], "needs cluster.gpus_per_worker >= 2"),
        (["trainer.resume_mode=from_path"], "trainer.resume_path"),
        (["cluster.max_trainer_restarts=-1"], "cluster.max_trainer_restarts=-1"),
        (["trainer.max_minutes=0"], "trainer.max_minutes=0"),
        (["trainer.schedule=minutes"], "trainer.schedule=minutes spans trainer.max_minutes"),
        (["trainer.schedule=hours", "trainer.max_minutes=5"], "trainer.schedule='hours' is not one of"),
        (["algo=gigpo", "env.history=full"], "needs env.history=none"),
        (["algo.module=rlfw_no_such_module"], "algo.module='rlfw_no_such_module' could not be imported"),
        (["model.train_autocast=float16"], "model.train_autocast='float16' is not one of"),
        (["model.train_autocast=bfloat16", "model.dtype=bfloat16"], "autocasts a float32 model"),
        (["model.engine_autocast=fp16"], "model.engine_autocast='fp16' is not one of"),
        (["model.compile=true", "cluster=local_2ranks"], "model.compile=true is not supported with cluster.trainer_ranks > 1"),
    ],
)
def test_cross_field_errors_say_how_to_fix(overrides, needle):
    cfg = load(overrides)
    with pytest.raises(ConfigError, match=re.escape(needle)):
        validate(cfg)


def test_dr_grpo_normalises_by_the_generation_budget():
    cfg = load(["algo=dr_grpo", "env.max_new_tokens=6"])
    assert cfg.algo.loss_max_tokens == 6
    validate(cfg)


def test_env_kwargs_come_from_the_schema():
    from rlfw.build import env_kwargs

    cfg = load(["env=maze", "env.cell_px=8", "env.max_turns=15"])
    assert env_kwargs(cfg.env) == {"max_turns": 15, "difficulty": "easy", "cell_px": 8, "action_format": "visgym"}


def test_user_env_from_own_module(tmp_path, monkeypatch):
    """A user's env registered in their own module trains through env=custom + env.module."""
    from rlfw.build import env_corpus, eval_tasks, make_env_fn

    (tmp_path / "user_envs_fixture.py").write_text(
        "import envs\n"
        "from envs.grid_goal import GridGoalEnv\n"
        "class Tiny(GridGoalEnv):\n"
        "    pass\n"
        "envs.register('rlfw/MyTiny-v0', 'user_envs_fixture:Tiny', size=4)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = load(["env=custom", "env.id=rlfw/MyTiny-v0", "env.module=user_envs_fixture", "+env.kwargs.cell_px=8"])
    make_env = make_env_fn(cfg.env)
    obs, _ = make_env().reset(seed=0)
    assert obs["image"].shape == (32, 32, 3)
    corpus, actions, px = env_corpus(make_env)
    assert len(actions) == 5 and px == 32
    tasks, layouts = eval_tasks(cfg.env)  # the GridGoal base class can export layouts
    assert len(tasks) == 64 and len(layouts) == 64 and tasks[0].layout == layouts[0]


def test_unregistered_env_id_says_how_to_fix():
    from rlfw.build import make_env_fn

    cfg = load(["env=custom", "env.id=rlfw/Nope-v0"])
    with pytest.raises(ValueError, match="env.module"):
        make_env_fn(cfg.env)


def test_sft_config_composes_and_rejects_noise_without_paths():
    validate_sft(load_sft([]))
    with pytest.raises(ConfigError, match="sft.noise"):
        validate_sft(load_sft(["sft.noise=0.1"]))
    with pytest.raises(ConfigError, match="sft.max_minutes"):
        validate_sft(load_sft(["sft.max_minutes=0"]))
    with pytest.raises(ConfigError, match=r"sft.junction_fraction=1.5 must be in \[0, 1\]"):
        validate_sft(load_sft(["sft.junction_fraction=1.5"]))
    with pytest.raises(ConfigError, match="sft.junction_fraction applies to sft.states=all_squares"):
        validate_sft(load_sft(["sft.states=oracle_path", "sft.junction_fraction=0.5"]))
    with pytest.raises(ConfigError, match="sft.schedule=minutes spans sft.max_minutes"):
        validate_sft(load_sft(["sft.schedule=minutes"]))
    with pytest.raises(ConfigError, match="sft.schedule='hours'"):
        validate_sft(load_sft(["sft.schedule=hours", "sft.max_minutes=5"]))
    validate_sft(load_sft(["sft.schedule=minutes", "sft.max_minutes=5"]))
    with pytest.raises(ConfigError, match="model.train_autocast"):
        validate_sft(load_sft(["model.train_autocast=fp8"]))
    with pytest.raises(ConfigError, match="algo.step_gamma"):
        validate(load(["algo=gigpo", "algo.step_gamma=1.5"]))


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_vllm_backend_without_vllm_says_how_to_install_it():
    with pytest.raises(ConfigError, match="scripts/setup.sh --vllm"):
        validate(load(["cluster.engine_backend=vllm"]))


def test_vllm_lora_rank_defaults_to_the_smallest_supported_rank():
    from rlfw.rollout.vllm_engine import vllm_lora_rank

    assert vllm_lora_rank(None, 12) == 16 and vllm_lora_rank(None, 32) == 32 and vllm_lora_rank(64, 8) == 64
    assert "vllm" not in sys.modules  # choosing and checking the vLLM backend does not import vLLM
