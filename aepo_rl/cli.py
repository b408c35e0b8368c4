"""The `aepo` command: train | sft | eval | compare | rollout | serve-search | report | config.

Every command that builds a config takes ``--preset``, ``--config FILE.yaml`` and dotted
overrides (``aepo train algorithm.clip_ratio_high=0.28 rollout.n=8``). Subcommands import
their modules lazily so that ``aepo config show`` stays instant.

``--plugin MODULE_OR_FILE.py`` (repeatable, before or after the subcommand) imports your own
losses, estimators, tools, tasks, rewards or engines before the config is validated, as do the
modules of the ``aepo_rl.plugins`` entry-point group (``docs/extending.md``).
"""

from __future__ import annotations

import argparse
import sys

from aepo_rl.config import PRESETS, ConfigError, load_config
from aepo_rl.registry import PluginError, load_plugins


def _config_args(parser: argparse.ArgumentParser, default_preset: str = "aepo") -> None:
    parser.add_argument("--preset", default=default_preset, help=f"one of: {', '.join(PRESETS)}")
    parser.add_argument("--config", dest="config_file", default=None, help="YAML file of config sections")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. rollout.n=8 trainer.steps=5")


def _config(args: argparse.Namespace, extra: dict | None = None):
    overrides = list(args.overrides)
    return load_config(args.preset, args.config_file, [f"{k}={v}" for k, v in (extra or {}).items()] + overrides)


def cmd_train(args: argparse.Namespace) -> int:
    from aepo_rl.train.pipeline import train_main

    if args.resume:
        if args.overrides or args.config_file or args.preset != "aepo":
            raise ConfigError("--resume continues a run with its own config.yaml; drop --preset, --config and overrides")
        return train_main(None, resume=args.resume)
    return train_main(_config(args))


def cmd_sft(args: argparse.Namespace) -> int:
    from aepo_rl.train.sft import sft_main

    return sft_main(_config(args), out_dir=args.out)


def cmd_eval(args: argparse.Namespace) -> int:
    from aepo_rl.evaluate import eval_main

    extra = {"eval.samples": args.samples} if args.samples is not None else {}
    if args.task:
        extra["task.name"] = args.task
    if args.greedy:
        extra["eval.greedy"] = "true"
    if args.model:
        extra["model.path"] = args.model
    return eval_main(_config(args, extra), out_file=args.out, endpoint=args.endpoint,
                     endpoint_model=args.endpoint_model)


def cmd_compare(args: argparse.Namespace) -> int:
    from aepo_rl.compare import compare_main

    presets = [p.strip() for p in args.presets.split(",") if p.strip()]
    for name in presets:
        if name not in PRESETS:
            raise ConfigError(f"unknown preset '{name}' in --presets; presets: {', '.join(PRESETS)}")
    return compare_main(_config(args), presets=presets, seeds=args.seeds, steps=args.steps, out_dir=args.out)


def cmd_rollout(args: argparse.Namespace) -> int:
    from aepo_rl.rollout.cli import rollout_main

    extra = {"task.name": args.task} if args.task else {}
    if args.model:
        extra["model.path"] = args.model
    return rollout_main(_config(args, extra), num_prompts=args.num_prompts, out_dir=args.out,
                        random_model=args.model is None)


def cmd_serve_search(args: argparse.Namespace) -> int:
    from aepo_rl.tools.server import serve_main

    return serve_main(corpus=args.corpus, host=args.host, port=args.port, topk=args.topk, seed=args.seed)


def cmd_report(args: argparse.Namespace) -> int:
    from aepo_rl.report import report_main

    return report_main(args.runs, out_dir=args.out)


def cmd_config(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from aepo_rl.config import describe, to_yaml

    if args.action == "docs":
        from aepo_rl.config_docs import reference_markdown, write_page

        if args.write:
            print(f"{args.write}: {'updated' if write_page(args.write) else 'up to date'}")
        else:
            print(reference_markdown(), end="")
        return 0
    cfg = _config(args)
    if args.yaml:
        print(to_yaml(cfg), end="")
        return 0
    table = Table(title=f"resolved config (preset {cfg.preset})")
    for column in ("key", "value", "meaning"):
        table.add_column(column, overflow="fold")
    for key, value, doc in describe(cfg):
        table.add_row(key, repr(value), doc)
    Console().print(table)
    return 0


PLUGIN_HELP = ("import this module (my_pkg.my_loss) or .py file before the config is read, so the losses, "
               "estimators, tools, tasks, rewards and engines it registers can be named; repeatable")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="aepo", description=__doc__.splitlines()[0])
    parser.add_argument("--plugin", dest="plugins", action="append", default=[], metavar="MODULE", help=PLUGIN_HELP)
    # The same option after the subcommand; its own dest, since a subcommand's values replace the top level's.
    plugin = argparse.ArgumentParser(add_help=False)
    plugin.add_argument("--plugin", dest="command_plugins", action="append", default=[], metavar="MODULE",
                        help=PLUGIN_HELP)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("train", parents=[plugin], help="the whole pipeline: tiny model, SFT, RL, before/after evaluation")
    _config_args(p)
    p.add_argument("--resume", default=None, help="continue the run in this folder from its last complete step")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("sft", parents=[plugin], help="cold-start SFT on the task's teacher demonstrations")
    _config_args(p)
    p.add_argument("--out", default=None, help="output folder (default runs/sft-<timestamp>)")
    p.set_defaults(func=cmd_sft)

    p = sub.add_parser("eval", parents=[plugin], help="pass@1 / pass@k of a model (or an OpenAI-compatible endpoint)")
    _config_args(p)
    p.add_argument("--model", default=None, help="Hugging Face model folder")
    p.add_argument("--task", default=None, help="task name (default: config task.name)")
    p.add_argument("--samples", type=int, default=None, help="samples per question K (default eval.samples)")
    p.add_argument("--greedy", action="store_true", help="greedy decoding")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    p.add_argument("--endpoint", default=None, help="OpenAI-compatible base URL to evaluate instead of --model")
    p.add_argument("--endpoint-model", default=None, help="model name at --endpoint")
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("compare", parents=[plugin], help="several presets from one SFT checkpoint, several seeds, one table")
    _config_args(p)
    p.add_argument("--presets", default="grpo,arpo,aepo")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--steps", type=int, default=None, help="RL steps per run (default trainer.steps)")
    p.add_argument("--out", default=None, help="output folder (default runs/compare-<timestamp>)")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("rollout", parents=[plugin], help="run one tree rollout and print each prompt's tree")
    _config_args(p)
    p.add_argument("--task", default=None, help="task name (default: config task.name, synthetic)")
    p.add_argument("--num-prompts", type=int, default=2)
    p.add_argument("--out", default="runs/rollout")
    p.add_argument("--model", default=None, help="Hugging Face model folder (default: a tiny random model)")
    p.set_defaults(func=cmd_rollout)

    p = sub.add_parser("serve-search", parents=[plugin], help="BM25 search server speaking Search-R1's /retrieve API")
    p.add_argument("--corpus", default="synthetic", help="a JSONL corpus file, 'synthetic' or 'wiki'")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--topk", type=int, default=3)
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic corpus")
    p.set_defaults(func=cmd_serve_search)

    p = sub.add_parser("report", parents=[plugin], help="plots and tables from run folders")
    p.add_argument("runs", nargs="+")
    p.add_argument("--out", default=None, help="output folder (default <first run>/plots)")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("config", parents=[plugin],
                       help="show the resolved config, or print the Markdown reference of every key")
    p.add_argument("action", choices=["show", "docs"], help="show: the resolved config; docs: the reference of the defaults")
    _config_args(p)
    p.add_argument("--yaml", action="store_true", help="show: print YAML instead of a table")
    p.add_argument("--write", default=None, metavar="PAGE.md",
                   help="docs: replace the generated part of this page (docs/configuration.md) instead of printing")
    p.set_defaults(func=cmd_config)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    unknown = [item for item in extra if "=" not in item or item.startswith("-")]
    if unknown or (extra and not hasattr(args, "overrides")):
        parser.error(f"unrecognized arguments: {' '.join(unknown or extra)}")
    if extra:
        args.overrides = list(args.overrides) + extra
    try:
        load_plugins(args.plugins + args.command_plugins)
        return int(args.func(args) or 0)
    except PluginError as err:
        print(f"aepo: {err}", file=sys.stderr)
        return 2
    except ConfigError as err:
        print(f"aepo: config error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
