"""What a run prints and draws at the end: pass@1 before and after, per evaluation set, and curves.

    python -m rlfw.report <run folder>     # print the before/after table, redraw pass_at_1.png
    python -m rlfw.report <sweep folder>   # rebuild summary.csv/md/png of a sweep (rlfw/sweep_report.py)
"""

from __future__ import annotations

import json
from pathlib import Path


def eval_series(metrics_path: Path, key: str, x: str = "step") -> tuple[list[float], list[float]]:
    """(x, value) of every logged row that has `key`; x is the step or timing/elapsed_min."""
    xs, ys = [], []
    for line in Path(metrics_path).read_text().splitlines():
        row = json.loads(line)
        if key in row:
            xs.append(row["step"] if x == "step" else row.get("timing/elapsed_min", float("nan")))
            ys.append(row[key])
    return xs, ys


def pass_at_1_keys(metrics_path: Path) -> list[str]:
    keys: set[str] = set()
    for line in Path(metrics_path).read_text().splitlines():
        keys |= {k for k in json.loads(line) if k.endswith("/pass_at_1") and k.startswith("eval/")
                 and not k.startswith("eval/all/")}
    return sorted(keys)


def before_after(metrics_path: Path) -> str:
    """A Markdown table: first and last pass@1 of every evaluation set, with its solvable ceiling."""
    lines = ["| eval set | pass@1 before | pass@1 after | solvable within the turn limit |", "|---|---:|---:|---:|"]
    for key in pass_at_1_keys(metrics_path):
        name = key.split("/")[1]
        steps, values = eval_series(metrics_path, key)
        _, ceiling = eval_series(metrics_path, f"eval/{name}/solvable_fraction")
        cap = f"{ceiling[-1]:.3f}" if ceiling else "n/a"
        lines.append(f"| {name} | {values[0]:.3f} (step {steps[0]}) | {values[-1]:.3f} (step {steps[-1]}) | {cap} |")
    return "\n".join(lines)


def plot(runs: dict[str, Path], out: Path, keys: list[str] | None = None, x: str = "step") -> Path:
    """Draw pass@1 curves of several runs ({label: metrics.jsonl}) into one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for label, path in runs.items():
        for key in keys or pass_at_1_keys(path):
            xs, ys = eval_series(path, key, x)
            if xs:
                ax.plot(xs, ys, marker="o", label=f"{label}: {key.split('/')[1]}")
    ax.set_xlabel("training step" if x == "step" else "wall-clock minutes")
    ax.set_ylabel("greedy pass@1")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> None:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m rlfw.report", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder", type=Path, help="a run folder (metrics.jsonl) or a sweep folder (hydra.sweep.dir)")
    folder = ap.parse_args(argv).folder
    if (folder / "metrics.jsonl").exists():
        print(before_after(folder / "metrics.jsonl"))
        print(f"wrote {plot({folder.name: folder / 'metrics.jsonl'}, folder / 'pass_at_1.png')}")
        return
    from rlfw.sweep_report import SUMMARY_FILES, is_sweep_dir, to_markdown, write_summary

    if not is_sweep_dir(folder):
        ap.error(f"{folder} holds neither metrics.jsonl (a run) nor job folders with .hydra/ (a sweep)")
    sweep = write_summary(folder)
    print(to_markdown(sweep))
    print(f"wrote {', '.join(str(folder / n) for n in SUMMARY_FILES)}")


if __name__ == "__main__":
    main()
