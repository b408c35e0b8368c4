"""F1 by difficulty of the PhantomWiki record (SFT and RL, mean over seeds ± 95% t-interval) beside the F1 the
PhantomWiki paper reports for LLMs (over all difficulties, hard mode: third-party numbers, docs/results.md).

    python lab/recorders/plot_phantomwiki.py --record DIR --out docs/images/phantomwiki_f1_by_difficulty.png

DIR is a folder of ``seed<s>.json`` files written by record_phantomwiki.py.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from aepo_rl.compare import mean_ci95  # noqa: E402

PAPER = {"ReAct GPT-4o": 0.387, "ReAct Llama-3.3-70B": 0.358, "GRPO Qwen2.5-3B": 0.314,
         "GRPO Qwen2.5-0.5B": 0.133}
"""F1 over all difficulties, hard mode, universes of 50 people (PhantomWiki, arXiv 2502.20377; third-party summary)."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--record", type=Path, required=True, help="folder of seed<s>.json (record_phantomwiki.py)")
    parser.add_argument("--out", type=Path, required=True, help="the PNG to write")
    args = parser.parse_args(argv)
    seeds = [json.loads(path.read_text()) for path in sorted(args.record.glob("seed*.json"))]
    if not seeds:
        raise SystemExit(f"no seed<s>.json in {args.record}: run record_phantomwiki.py --out {args.record} first")
    levels = sorted({level for s in seeds for level in s["rl"]["by_difficulty"]}, key=int)
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for stage, offset, color in (("sft", -0.08, "tab:gray"), ("rl", 0.08, "tab:blue")):
        stats = [mean_ci95([s[stage]["by_difficulty"][level]["f1"] for s in seeds
                            if level in s[stage]["by_difficulty"]]) for level in levels]
        ax.errorbar([int(level) + offset for level in levels], [x["mean"] for x in stats],
                    yerr=[x["ci95"] or 0 for x in stats], fmt="o-", color=color, capsize=3,
                    label=f"tiny agent, {stage.upper()} ({len(seeds)} seeds, easy mode, held-out universes)")
    for (name, f1), style in zip(PAPER.items(), ("--", "-.", ":", (0, (1, 3)))):
        ax.axhline(f1, color="tab:red", linestyle=style, linewidth=1,
                   label=f"{name}: {f1:.3f} (all difficulties, hard mode)")
    ax.set_xticks([int(level) for level in levels])
    ax.set_xlabel("PhantomWiki difficulty")
    ax.set_ylabel("F1")
    ax.set_ylim(0, 0.45)
    ax.set_title("PhantomWiki F1 by difficulty: the tiny agent beside the paper's LLMs "
                 "(not a like-for-like comparison)", fontsize=8)
    ax.legend(fontsize=6, loc="upper right")
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
