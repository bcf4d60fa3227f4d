"""Plot pass@1 curves from one or more runs' metrics.jsonl (e.g. GRPO beside continued SFT).

    python scripts/plot_curves.py outputs/<run>/metrics.jsonl --label grpo --out pass_at_1.png
    python scripts/plot_curves.py a/metrics.jsonl b/metrics.jsonl --label grpo sft --x minutes
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rlfw.report import before_after, plot


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("metrics", nargs="+", type=Path)
    ap.add_argument("--label", nargs="*", default=None, help="one label per metrics file")
    ap.add_argument("--keys", nargs="*", default=None, help="metric keys (default: every eval/<set>/pass_at_1)")
    ap.add_argument("--x", choices=["step", "minutes"], default="step")
    ap.add_argument("--out", type=Path, default=Path("pass_at_1.png"))
    args = ap.parse_args()
    labels = args.label or [p.parent.name for p in args.metrics]
    for label, path in zip(labels, args.metrics):
        print(f"{label}:\n{before_after(path)}\n")
    print(f"wrote {plot(dict(zip(labels, args.metrics)), args.out, args.keys, args.x)}")


if __name__ == "__main__":
    main()
