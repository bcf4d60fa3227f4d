"""`--help` of the entry points lists every config key with its docstring (rlfw/cli_help.py)."""

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from rlfw import config
from rlfw.cli_help import attribute_docs, field_docs

ROOT = Path(__file__).resolve().parents[2]


def _help(module: str) -> str:
    proc = subprocess.run([sys.executable, "-m", module, "--help"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _doc_follows(text: str, key_line: str, doc_part: str) -> None:
    """`key_line` is printed, and its doc (the indented lines below it) contains `doc_part`."""
    lines = text.splitlines()
    i = next((i for i, line in enumerate(lines) if line.strip().startswith(key_line)), None)
    assert i is not None, f"{key_line!r} not in --help"
    doc = []
    for line in lines[i + 1:]:
        if not line.startswith("      "):
            break
        doc.append(line.strip())
    assert doc_part in " ".join(doc), f"{key_line!r}: {doc_part!r} not in its doc {doc!r}"


def test_run_help_documents_fields_and_groups():
    text = _help("rlfw.run")
    assert text.startswith("Usage: python -m rlfw.run [group=option ...] [key=value ...]")
    _doc_follows(text, "algo.n_samples_per_prompt: int = 8", "the GRPO group size")
    _doc_follows(text, "trainer.ckpt_interval: int = 0", "Write a full checkpoint")
    _doc_follows(text, "model.lora.rank: int = 16", "0 means full fine-tuning")
    _doc_follows(text, "env.difficulty: str = easy", "easy (9x9 grid) or hard")
    _doc_follows(text, "trainer.output_dir: str = ${hydra:runtime.output_dir}", "Run folder")  # `$` survives
    assert "env=maze / maze_hard add (MazeEnvConfig):" in text
    # an Optional node (off by default) lists its keys too, and its group is named
    _doc_follows(text, "sft_stage.steps: int = 3000", "Optimizer steps")
    assert "rlfw.run uses: algo, env, model, cluster, logger, sft_stage, experiment." in " ".join(text.split())
    groups = {line.split(":")[0]: line.split(": ")[1].split(", ") for line in text.splitlines()
              if line.split(":")[0] in ("algo", "env", "model", "cluster", "logger", "experiment") and ", " in line}
    assert {"grpo", "dapo", "gspo"} <= set(groups["algo"])
    assert {"maze", "maze_hard", "grid_goal"} <= set(groups["env"])
    assert "tiny_vl" in groups["model"] and "debug" in groups["experiment"]


def test_sft_help_documents_fields():
    text = _help("rlfw.sft")
    assert text.startswith("Usage: python -m rlfw.sft")
    _doc_follows(text, "sft.states: str = all_squares", "oracle_path: states along oracle walks")
    _doc_follows(text, "env.difficulty: str = easy", "easy (9x9 grid)")
    assert "algo.lr" not in text and "trainer." not in text
    assert "rlfw.sft uses: env, model, logger, experiment." in text


def _schemas():
    return [c for c in vars(config).values() if dataclasses.is_dataclass(c) and c.__module__ == config.__name__]


@pytest.mark.parametrize("schema", _schemas(), ids=lambda c: c.__name__)
def test_every_schema_field_has_a_doc(schema):
    own = attribute_docs(schema)
    inherited = {f.name for base in schema.__mro__[1:] if dataclasses.is_dataclass(base) for f in dataclasses.fields(base)}
    missing = [f.name for f in dataclasses.fields(schema) if f.name not in inherited and not own.get(f.name, "").strip()]
    assert not missing, f"{schema.__name__}: add a docstring (a string literal on the next line) to {missing}"


def test_field_docs_walks_nested_schemas():
    rows = {key: (typ, default, doc) for key, typ, default, doc in field_docs(config.Config)}
    assert rows["model.lora.rank"] == ("int", "16", "LoRA rank; 0 means full fine-tuning.")
    assert rows["model.lora"][:2] == ("LoraConfig", "")
    assert rows["sft_stage"][:2] == ("Optional[SFTConfig]", "null") and rows["sft_stage.lr"][0] == "float"
    assert rows["algo.name"][1] == "???" and rows["env.kwargs"][1] == "{}"
    assert rows["logger.wandb.mode"][1] == "offline"
    assert all(doc for _, _, _, doc in field_docs(config.Config) + field_docs(config.SFTRunConfig))
