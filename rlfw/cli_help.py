"""`--help` of `python -m rlfw.run` (and rlfw.sft, rlfw.eval): every config key with its type, default and doc.

The docs are the attribute docstrings of the schemas in rlfw.config (the string literal right after
each field). Python drops those at runtime, so they are read from the source with `ast`.
`register_help_resolver()` (called by rlfw.config.register_configs) registers the OmegaConf
resolver `rlfw_help`; conf/config.yaml, conf/sft.yaml and conf/eval.yaml set

    hydra.help.template: ${rlfw_help:Config,${hydra.help.app_name}}

so Hydra resolves the page when it prints `--help`, then fills in $APP_CONFIG_GROUPS itself.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import textwrap
import typing
from pathlib import Path

from omegaconf import MISSING, OmegaConf

from rlfw import config as schemas

WIDTH = 100


@functools.lru_cache(maxsize=None)
def attribute_docs(cls: type) -> dict[str, str]:
    """{field name: docstring} of the fields a class body documents (not those it inherits)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body
    docs = {}
    for stmt, nxt in zip(body, body[1:]):
        if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
                and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)):
            docs[stmt.target.id] = inspect.cleandoc(nxt.value.value)
    return docs


def _doc(cls: type, name: str) -> str:
    for base in cls.__mro__:  # a subclass inherits its bases' field docs
        if dataclasses.is_dataclass(base) and name in attribute_docs(base):
            return attribute_docs(base)[name]
    return ""


def _fmt(value) -> str:
    """A value as you would write it in a Hydra override."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_fmt(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_fmt(v)}" for k, v in value.items()) + "}"
    if value == "":
        return "''"
    return str(value)


def _default(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        return _fmt(f.default)  # omegaconf's MISSING is "???"
    if f.default_factory is not dataclasses.MISSING:
        return _fmt(f.default_factory())
    return MISSING


def _type(t) -> str:
    """The annotation as written (a string under `from __future__ import annotations`)."""
    return t if isinstance(t, str) else t.__name__ if isinstance(t, type) else str(t).replace("typing.", "")


def _node_type(t) -> type | None:
    """The dataclass a field's type names, Optional[...] unwrapped (Config.sft_stage); None if not a node."""
    args = [a for a in typing.get_args(t) if a is not type(None)] if typing.get_origin(t) is typing.Union else [t]
    return args[0] if len(args) == 1 and dataclasses.is_dataclass(args[0]) else None


def _nested(cls: type) -> dict[str, type]:
    """Fields of `cls` whose type is itself a dataclass (a config node), or an Optional one."""
    hints = typing.get_type_hints(cls)
    return {f.name: node for f in dataclasses.fields(cls) if (node := _node_type(hints[f.name]))}


def field_docs(schema: type, prefix: str = "") -> list[tuple[str, str, str, str]]:
    """(dotted key, type, default, doc) of every field, nested dataclasses included.

    A nested node (e.g. model.lora) gets its own row, with its class name as type and no default,
    followed by its fields (model.lora.rank, ...).
    """
    nested = _nested(schema)
    rows = []
    for f in dataclasses.fields(schema):
        key = prefix + f.name
        if f.name in nested:
            optional = f.default is None  # an Optional node, off (null) unless a group or preset sets it
            rows.append((key, f"Optional[{nested[f.name].__name__}]" if optional else nested[f.name].__name__,
                         "null" if optional else "", _doc(schema, f.name)))
            rows += field_docs(nested[f.name], key + ".")
        else:
            rows.append((key, _type(f.type), _default(f), _doc(schema, f.name)))
    return rows


def _wrap(text: str, indent: str) -> str:
    return textwrap.fill(" ".join(text.split()), WIDTH, initial_indent=indent, subsequent_indent=indent)


def _render(rows) -> list[str]:
    out = []
    for key, typ, default, doc in rows:
        out.append(f"  {key}: {typ}" + (f" = {default}" if default else ""))
        out.append(_wrap(doc, "      "))
    return out


def _variants(group: str, base: type) -> list[tuple[type, list[str]]]:
    """Subclass schemas of a group's node type, with the presets (conf/<group>/*.yaml) that use them."""
    from hydra.core.config_store import ConfigStore

    stored = ConfigStore.instance().repo.get(group, {})
    out = []
    for sub in base.__subclasses__():
        names = {n.removesuffix(".yaml") for n, c in stored.items() if OmegaConf.get_type(c.node) is sub}
        presets = sorted(p.stem for p in (Path(schemas.repo_root()) / "conf" / group).glob("*.yaml")
                         if names & set(map(str, OmegaConf.load(p).get("defaults", []))))
        out.append((sub, presets))
    return out


def help_text(root: type, app: str = "rlfw.run") -> str:
    """The help page of an entry point whose config schema is `root` (Config, SFTRunConfig, EvalRunConfig).

    The result is a string.Template for Hydra: it contains $APP_CONFIG_GROUPS, and every other `$`
    is doubled.
    """
    nested = _nested(root)
    conf = Path(schemas.repo_root()) / "conf"
    groups = [n for n in nested if (conf / n).is_dir()] + ["experiment"]
    lines = [
        f"Usage: python -m {app} [group=option ...] [key=value ...]",
        f"       python -m {app} -m key=a,b ...    (sweep: one run per combination)",
        *([f"       python -m {app} -m hydra/launcher=joblib hydra.launcher.n_jobs=2 key=a,b ...    (two jobs at once)",
           f"       python -m {app} -m experiment=sweep_optuna    (Optuna study maximizing sweep.objective)"]
          if "sweep" in nested else []),
        "",
        "== Config groups (group=option) ==",
        _wrap(f"{app} uses: {', '.join(groups)}. base_* options are the typed schemas the presets extend.", ""),
        "",
        "$APP_CONFIG_GROUPS",
        "== Config keys (key=value) ==",
        "key: type = default. Defaults are the schema's; ??? means the chosen preset sets it. To see the",
        "composed values with your overrides: --cfg job (add --resolve to resolve ${...}).",
    ]
    for name, node in nested.items():
        lines += ["", f"{name}:", _wrap(_doc(root, name), "  ")]
        lines += _render(field_docs(node, name + "."))
        base_fields = {f.name for f in dataclasses.fields(node)}
        for sub, presets in _variants(name, node):
            lines += ["", f"  {name}={' / '.join(presets) or '...'} add ({sub.__name__}):"]
            lines += _render(r for r in field_docs(sub, name + ".") if r[0].split(".")[1] not in base_fields)
    top = [r for r in field_docs(root) if "." not in r[0] and r[0] not in nested]
    if top:
        lines += ["", "top level:"] + _render(top)
    lines += ["", "Hydra's own flags (--cfg, --resolve, --multirun, ...): --hydra-help", ""]
    return "\n".join(lines).replace("$", "$$").replace("$$APP_CONFIG_GROUPS", "$APP_CONFIG_GROUPS")


def _resolve(schema: str, app: str) -> str:
    root = getattr(schemas, schema, None)
    if not dataclasses.is_dataclass(root):
        raise ValueError(f"rlfw_help: {schema!r} is not a config schema in rlfw.config")
    return help_text(root, app)


def register_help_resolver() -> None:
    if not OmegaConf.has_resolver("rlfw_help"):
        OmegaConf.register_new_resolver("rlfw_help", _resolve)
