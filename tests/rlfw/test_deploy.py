"""The cluster image (deploy/docker/Dockerfile) installs what setup.cfg declares, at pinned versions.
Docker itself is not needed: the files are read."""

import configparser
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "deploy" / "docker"


def _name(requirement: str) -> str:
    return re.split(r"[<>=!\[ ;]", requirement.strip(), maxsplit=1)[0].lower()


def _declared() -> set[str]:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    extras = cfg["options.extras_require"]
    reqs = cfg["options"]["install_requires"].split("\n") + extras["vllm"].split("\n") + extras["serve"].split("\n")
    return {_name(r) for r in reqs if r.strip() and not r.strip().startswith("#")}


def _pins(path: Path = DOCKER / "constraints-gpu.txt") -> dict[str, str]:
    """A constraints file's `name==version` lines (every line must pin one)."""
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            assert "==" in line, f"unpinned: {line}"
            name, version = line.split("==")
            pins[_name(name)] = version
    return pins


def test_every_declared_package_is_pinned_for_the_image():
    missing = _declared() - _pins().keys()
    assert not missing, f"setup.cfg declares {sorted(missing)}, not pinned in deploy/docker/constraints-gpu.txt"


def test_the_dockerfile_installs_the_project_with_the_vllm_extra_under_the_pins():
    text = (DOCKER / "Dockerfile").read_text()
    assert re.search(r'pip install -c /tmp/constraints-gpu.txt -e "\.\[vllm,serve\]"', text)
    assert "COPY deploy/docker/constraints-gpu.txt" in text
    assert re.search(r"^FROM nvidia/cuda:\S+", text, re.M)
    pins = _pins()
    # what is installed before the constrained step carries the same versions as the pins
    for name, version in re.findall(r'"([a-z]+)==([0-9.]+)"', text):
        assert pins[name] == version, (name, version, pins[name])
    for package in ("rlfw", "envs", "conf"):
        assert f"COPY {package} {package}" in text


def test_the_pins_match_the_versions_ci_runs_here():
    """The CPU environment that the tests ran in has the pinned versions (torch: the same release,
    CPU build here)."""
    from importlib.metadata import version

    pins = _pins()
    for name in ("transformers", "peft", "hydra-core", "omegaconf", "ray", "gymnasium", "safetensors", "wandb"):
        assert version(name) == pins[name], name
    assert version("torch").split("+")[0] == pins["torch"]


def test_the_cpu_environment_is_the_lock():
    """scripts/setup.sh installs under constraints-cpu.txt, the lock of what CI tests: every locked
    package is installed at its locked version (a new release on the registry changes nothing)."""
    from importlib.metadata import PackageNotFoundError, version

    lock = _pins(ROOT / "constraints-cpu.txt")
    assert lock["torch"] == _pins()["torch"]
    assert lock["transformers"] == _pins()["transformers"]
    wrong = {}
    for name, pinned in lock.items():
        try:
            installed = version(name)
        except PackageNotFoundError:
            continue  # locked but not needed by what this environment installed
        if installed.split("+")[0] != pinned:
            wrong[name] = (installed, pinned)
    assert not wrong, f"installed vs locked: {wrong}"
